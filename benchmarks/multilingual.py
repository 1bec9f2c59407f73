"""One multilingual model against bilingual ones given the same total time, on Multi30k test2016.

    python benchmarks/multilingual.py --output multilingual.json [--runs runs] [--skip-training]
    python benchmarks/multilingual.py --temperature --output temperature.json

The second form trains recipes/multilingual/captions_tatoeba.yaml (the six caption directions and
Tatoeba's English-French both ways) at T = 5 and at T = 1 and scores the caption directions.

Trains recipes/multilingual/captions_6way.yaml (six directions, {de, fr, cs} <-> en, its max_time)
and one recipes/multilingual/captions_bilingual.yaml model per direction (each its max_time: a sixth),
then scores every direction of test2016 with `mtkit evaluate --off-target`: BLEU, chrF and the share of
outputs in another language. The zero-shot directions (de, fr, cs among themselves) are translated
by the multilingual model directly and by pivoting through English with the same model. Prints a
table and writes every figure as JSON. Run it alone: the budgets are wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

DATA = Path("../shared/data/multi30k")
MULTI = "recipes/multilingual/captions_6way.yaml"
TATOEBA = "recipes/multilingual/captions_tatoeba.yaml"
BILINGUAL = "recipes/multilingual/captions_bilingual.yaml"
SUPERVISED = [("de", "en"), ("en", "de"), ("fr", "en"), ("en", "fr"), ("cs", "en"), ("en", "cs")]
ZERO_SHOT = [("de", "fr"), ("fr", "de"), ("de", "cs"), ("cs", "de"), ("fr", "cs"), ("cs", "fr")]
LANGUAGES = "de,en,fr,cs"


def mtkit(*args: str) -> str:
    """Run one mtkit command; its standard output (the progress goes to the terminal)."""
    done = subprocess.run([sys.executable, "-m", "mtkit", *args], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"mtkit {' '.join(args)} failed ({done.returncode})")
    return done.stdout


def test_file(lang: str) -> Path:
    return DATA / f"test_2016_flickr.{lang}.gz"


def bilingual_overrides(src: str, tgt: str, runs: Path) -> list[str]:
    name = f"multi30k_{src}_{tgt}"
    files = {
        "data.train.src": DATA / f"train.{src}.gz",
        "data.train.tgt": DATA / f"train.{tgt}.gz",
        "data.valid.src": DATA / f"val.{src}.gz",
        "data.valid.tgt": DATA / f"val.{tgt}.gz",
        "data.test.src": test_file(src),
        "data.test.tgt": test_file(tgt),
    }
    sets = [f"name={name}", f"src_lang={src}", f"tgt_lang={tgt}", f"run_dir={runs / name}"]
    return [item for key in sets + [f"{k}={v}" for k, v in files.items()] for item in ("--set", key)]


def train(recipe: str, overrides: list[str]) -> None:
    for command in (["tokenizer", "train"], ["prepare"], ["train"]):
        mtkit(*command, recipe, *overrides, *(["--overwrite"] if command == ["train"] else []))


def evaluate(model: Path, src: Path, ref: Path, tgt_lang: str | None, tagged: bool) -> dict:
    """BLEU, chrF and off-target rate of `model` translating `src` into `tgt_lang`."""
    language = ["--tgt-lang", tgt_lang] if tagged else []
    found = json.loads(
        mtkit("evaluate", "-m", str(model), "--src", str(src), "--ref", str(ref), *language, "--off-target", "--json")
    )
    scores, direction = found["scores"], next(iter(found["directions"].values()))
    return {"bleu": scores["BLEU"]["score"], "chrf": scores["chrF"]["score"], "off_target": direction["off_target"]}


def pivot(model: Path, src: str, tgt: str) -> dict:
    """src -> en -> tgt with the multilingual model."""
    with tempfile.TemporaryDirectory() as scratch:
        english = Path(scratch) / "pivot.en"
        mtkit("translate", "-m", str(model), "--tgt-lang", "en", "-i", str(test_file(src)), "-o", str(english))
        return evaluate(model, english, test_file(tgt), tgt, tagged=True)


def temperature_study(args: argparse.Namespace) -> dict:
    """The caption directions of one model trained with Tatoeba beside them, at T = 5 and at T = 1."""
    results: dict = {}
    for temperature in (5, 1):
        run = args.runs / f"multi30k_tatoeba_t{temperature}"
        if not args.skip_training:
            overrides = ["--set", f"data.temperature={temperature}", "--set", f"run_dir={run}"]
            for command in (["tokenizer", "train"], ["prepare"]) if temperature == 5 else ():
                mtkit(*command, TATOEBA, *overrides)
            mtkit("train", TATOEBA, *overrides, "--overwrite")
        results[f"T={temperature}"] = {
            f"{src}-{tgt}": evaluate(run, test_file(src), test_file(tgt), tgt, tagged=True) for src, tgt in SUPERVISED
        }
        print(f"T={temperature}", json.dumps(results[f"T={temperature}"]), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("multilingual.json"))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--skip-training", action="store_true", help="Score the models already in --runs.")
    parser.add_argument("--temperature", action="store_true", help="The temperature study instead (T = 5 against T = 1).")
    args = parser.parse_args()
    if args.temperature:
        results = temperature_study(args)
        args.output.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        print(f"written to {args.output}")
        return
    multi = args.runs / "multi30k_6way"
    if not args.skip_training:
        train(MULTI, ["--set", f"run_dir={multi}"])
        for src, tgt in SUPERVISED:
            train(BILINGUAL, bilingual_overrides(src, tgt, args.runs))
    results: dict = {"supervised": {}, "zero_shot": {}}
    for src, tgt in SUPERVISED:
        way = f"{src}-{tgt}"
        results["supervised"][way] = {
            "multilingual": evaluate(multi, test_file(src), test_file(tgt), tgt, tagged=True),
            "bilingual": evaluate(args.runs / f"multi30k_{src}_{tgt}", test_file(src), test_file(tgt), tgt, tagged=False),
        }
        print(way, json.dumps(results["supervised"][way]), flush=True)
    for src, tgt in ZERO_SHOT:
        way = f"{src}-{tgt}"
        direct = evaluate(multi, test_file(src), test_file(tgt), tgt, tagged=True)
        results["zero_shot"][way] = {"direct": direct, "pivot": pivot(multi, src, tgt)}
        print(way, json.dumps(results["zero_shot"][way]), flush=True)
    args.output.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
