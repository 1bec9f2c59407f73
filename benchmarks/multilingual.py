"""One multilingual model against bilingual ones given the same total time, on Multi30k test2016.

    python -m benchmarks.multilingual --output multilingual.json [--runs runs] [--skip-training]
    python -m benchmarks.multilingual --temperature --output temperature.json

The second form trains recipes/multilingual/captions_tatoeba.yaml (the six caption directions and
Tatoeba's English-French both ways) at T = 5 and at T = 1 and scores the caption directions.

Trains recipes/multilingual/captions_6way.yaml (six directions, {de, fr, cs} <-> en, its max_time)
and one recipes/multilingual/captions_bilingual.yaml model per direction (each its max_time: a sixth),
then scores every direction of test2016 with `mtkit evaluate --off-target`: BLEU, chrF and the share of
outputs in another language. The zero-shot directions (de, fr, cs among themselves) are translated
by the multilingual model directly and by pivoting through English with the same model. Prints a
table and writes every figure as JSON. Run it alone: the budgets are wall-clock time.

`--smoke` (either form): tiny models on the tests' slice for the directions de-en and en-fr, and de-fr
zero-shot, their mtkit commands run in this process.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks import common
from benchmarks.common import MtkitCommands, set_args

DATA = Path("../shared/data/multi30k")
MULTI = "recipes/multilingual/captions_6way.yaml"
TATOEBA = "recipes/multilingual/captions_tatoeba.yaml"
BILINGUAL = "recipes/multilingual/captions_bilingual.yaml"
SUPERVISED = [("de", "en"), ("en", "de"), ("fr", "en"), ("en", "fr"), ("cs", "en"), ("en", "cs")]
ZERO_SHOT = [("de", "fr"), ("fr", "de"), ("de", "cs"), ("cs", "de"), ("fr", "cs"), ("cs", "fr")]
LANGUAGES = "de,en,fr,cs"


def test_file(args: argparse.Namespace, lang: str) -> Path:
    return args.data / f"test_2016_flickr.{lang}.gz"


def bilingual_overrides(args: argparse.Namespace, src: str, tgt: str) -> list[str]:
    name = f"multi30k_{src}_{tgt}"
    files = {
        "data.train.src": args.data / f"train.{src}.gz",
        "data.train.tgt": args.data / f"train.{tgt}.gz",
        "data.valid.src": args.data / f"val.{src}.gz",
        "data.valid.tgt": args.data / f"val.{tgt}.gz",
        "data.test.src": test_file(args, src),
        "data.test.tgt": test_file(args, tgt),
    }
    sets = [f"name={name}", f"src_lang={src}", f"tgt_lang={tgt}", f"run_dir={args.runs / name}"]
    return set_args(sets + [f"{k}={v}" for k, v in files.items()] + smoke_overrides(args, name, []))


def smoke_overrides(args: argparse.Namespace, name: str, directions: list[tuple[str, str]]) -> list[str]:
    """--smoke: a tiny model, its data under --runs, and `directions` of the tests' slice as a multilingual
    recipe's corpora; nothing otherwise."""
    if not args.smoke:
        return []
    overrides = ["tokenizer.vocab_size=300", *common.SMOKE_MODEL, *common.SMOKE_TRAIN, f"data_dir={args.runs / 'data' / name}"]
    for split, prefix in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        corpora = [
            f"{{src: {args.data}/{prefix}.{src}.gz, tgt: {args.data}/{prefix}.{tgt}.gz, src_lang: {src}, tgt_lang: {tgt}"
            + (f", name: {src}-{tgt}}}" if split == "train" else "}")
            for src, tgt in directions
        ]
        overrides += [f"data.{split}=[{', '.join(corpora)}]"] if directions else []
    return overrides


def train(commands: MtkitCommands, recipe: str, overrides: list[str]) -> None:
    for command in (["tokenizer", "train"], ["prepare"], ["train"]):
        commands.run([*command, recipe, *overrides, *(["--overwrite"] if command == ["train"] else [])])


def evaluate(commands: MtkitCommands, model: Path, src: Path, ref: Path, tgt_lang: str | None, tagged: bool) -> dict:
    """BLEU, chrF and off-target rate of `model` translating `src` into `tgt_lang`."""
    language = ["--tgt-lang", tgt_lang] if tagged else []
    found = json.loads(commands.run(["evaluate", "-m", model, "--src", src, "--ref", ref, *language, "--off-target", "--json"]))
    scores, direction = found["scores"], next(iter(found["directions"].values()))
    return {"bleu": scores["BLEU"]["score"], "chrf": scores["chrF"]["score"], "off_target": direction["off_target"]}


def pivot(commands: MtkitCommands, args: argparse.Namespace, model: Path, src: str, tgt: str) -> dict:
    """src -> en -> tgt with the multilingual model."""
    with tempfile.TemporaryDirectory() as scratch:
        english = Path(scratch) / "pivot.en"
        commands.run(["translate", "-m", model, "--tgt-lang", "en", "-i", test_file(args, src), "-o", english])
        return evaluate(commands, model, english, test_file(args, tgt), tgt, tagged=True)


def temperature_study(commands: MtkitCommands, args: argparse.Namespace) -> dict:
    """The caption directions of one model trained with Tatoeba beside them, at T = 5 and at T = 1."""
    results: dict = {}
    for temperature in (5, 1):
        run = args.runs / f"multi30k_tatoeba_t{temperature}"
        if not args.skip_training:
            overrides = set_args([f"data.corpus_temperature={temperature}", f"run_dir={run}"])
            overrides += set_args(smoke_overrides(args, "multi30k_tatoeba", args.supervised))
            for command in (["tokenizer", "train"], ["prepare"]) if temperature == 5 else ():
                commands.run([*command, TATOEBA, *overrides])
            commands.run(["train", TATOEBA, *overrides, "--overwrite"])
        results[f"T={temperature}"] = {
            f"{src}-{tgt}": evaluate(commands, run, test_file(args, src), test_file(args, tgt), tgt, tagged=True)
            for src, tgt in args.supervised
        }
        print(f"T={temperature}", json.dumps(results[f"T={temperature}"]), flush=True)
    return results


def multilingual_study(commands: MtkitCommands, args: argparse.Namespace) -> dict:
    """Train the multilingual model and a bilingual one per direction (unless --skip-training), then score them."""
    multi = args.runs / "multi30k_6way"
    if not args.skip_training:
        train(commands, MULTI, set_args([f"run_dir={multi}", *smoke_overrides(args, "multi30k_6way", args.supervised)]))
        for src, tgt in args.supervised:
            train(commands, BILINGUAL, bilingual_overrides(args, src, tgt))
    results: dict = {"supervised": {}, "zero_shot": {}}
    for src, tgt in args.supervised:
        way, files = f"{src}-{tgt}", (test_file(args, src), test_file(args, tgt))
        results["supervised"][way] = {
            "multilingual": evaluate(commands, multi, *files, tgt, tagged=True),
            "bilingual": evaluate(commands, args.runs / f"multi30k_{src}_{tgt}", *files, tgt, tagged=False),
        }
        print(way, json.dumps(results["supervised"][way]), flush=True)
    for src, tgt in args.zero_shot:
        way = f"{src}-{tgt}"
        direct = evaluate(commands, multi, test_file(args, src), test_file(args, tgt), tgt, tagged=True)
        results["zero_shot"][way] = {"direct": direct, "pivot": pivot(commands, args, multi, src, tgt)}
        print(way, json.dumps(results["zero_shot"][way]), flush=True)
    return results


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("multilingual.json"))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--skip-training", action="store_true", help="Score the models already in --runs.")
    parser.add_argument("--temperature", action="store_true", help="The temperature study instead (T = 5 against T = 1).")
    common.add_smoke_options(parser)
    parser.set_defaults(data=DATA, supervised=SUPERVISED, zero_shot=ZERO_SHOT)  # --smoke's tiny ones replace them
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the first lines of the tests' slice (no Czech in it) for two directions and one zero-shot one, in `work`."""
    args.data, args.runs = common.smoke_corpus(work), work / "multilingual"
    args.supervised, args.zero_shot = [("de", "en"), ("en", "fr")], [("de", "fr")]


def run_study(args: argparse.Namespace) -> dict:
    """The temperature study (--temperature) or the multilingual one, its mtkit commands run in this process with --smoke."""
    study = temperature_study if args.temperature else multilingual_study
    return {**common.smoke_label(args), **study(MtkitCommands(in_process=args.smoke), args)}


def main() -> None:
    args = parse_args()
    common.measure_and_write(args, tiny_arguments, run_study, args.output)
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
