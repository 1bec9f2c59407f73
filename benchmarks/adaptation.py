"""Domain adaptation, measured: a general Tatoeba en->fr model adapted to Multi30k image captions.

    python -m benchmarks.adaptation [--out benchmarks/results/adaptation.json] [--skip-training] [--smoke]

Runs the four recipes of recipes/tatoeba/ one after another (each alone on the machine: two of them
have a time budget) and scores every model on Multi30k test2016 (en->fr) and on the Tatoeba test set:
  (a) general_en_fr.yaml       the general model: 3,500 updates on 149,400 Tatoeba pairs (resumed if interrupted)
  (b) captions_scratch.yaml    from scratch on the first 5,000 Multi30k caption pairs, 10 minutes
  (c) captions_finetune.yaml   (a) fine-tuned on the same 5,000 caption pairs, 10 minutes
  (d) captions_mixed.yaml      (a) fine-tuned on the captions plus 5,000 general pairs an epoch, 10 minutes
Prints BLEU and chrF for each model and test set (beam 5) and writes them as JSON with the commands.
`--smoke`: (a) and (c) as tiny models on the tests' slice (its validation split stands in for Tatoeba's
test set), their mtkit commands run in this process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

from benchmarks import common
from benchmarks.common import MtkitCommands, set_args

RECIPES = Path("recipes/tatoeba")
DATA = Path("../shared/data")
MODELS = {
    "a_general": ("general_en_fr.yaml", "runs/tatoeba_general_en_fr"),
    "b_scratch": ("captions_scratch.yaml", "runs/tatoeba_captions_scratch"),
    "c_finetune": ("captions_finetune.yaml", "runs/tatoeba_captions_finetune"),
    "d_mixed": ("captions_mixed.yaml", "runs/tatoeba_captions_mixed"),
}
TESTS = {
    "multi30k_test2016": (DATA / "multi30k/test_2016_flickr.en.gz", DATA / "multi30k/test_2016_flickr.fr.gz"),
    "tatoeba_test": (DATA / "tatoeba-en-fr/test.en.gz", DATA / "tatoeba-en-fr/test.fr.gz"),
}


def train(commands: MtkitCommands, recipe: Path, run: Path, overrides: list[str]) -> None:
    """Prepare and train a recipe; a run that exists is resumed (a finished one stops at once)."""
    if (run / "last.pt").is_file():
        commands.run(["train", recipe, *set_args(overrides), "--resume"])
        return
    if "init_from" not in recipe.read_text(encoding="utf-8"):
        commands.run(["tokenizer", "train", recipe, *set_args(overrides)])
    commands.run(["prepare", recipe, *set_args(overrides)])
    commands.run(["train", recipe, *set_args(overrides), "--overwrite"])


def score(commands: MtkitCommands, run: str, source: Path, reference: Path) -> dict[str, float]:
    """BLEU and chrF of a run on one test set, at beam 5 (`mtkit evaluate --json`)."""
    arguments = ["evaluate", "-m", run, "--src", source, "--ref", reference, "--beam", 5, "--json"]
    report = json.loads(commands.run(arguments))
    return {"bleu": round(report["scores"]["BLEU"]["score"], 2), "chrf": round(report["scores"]["chrF"]["score"], 2)}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/adaptation.json"))
    parser.add_argument("--skip-training", action="store_true", help="score the runs as they are")
    common.add_smoke_options(parser)
    parser.set_defaults(models=MODELS, tests=TESTS, recipe_overrides={})  # --smoke's tiny ones replace them
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: (a) and (c) as tiny models on the first lines of the tests' slice, in `work`."""
    corpus = common.smoke_corpus(work)
    splits = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
    data = [f"data.{key}={{src: {corpus}/{name}.en.gz, tgt: {corpus}/{name}.fr.gz}}" for key, name in splits.items()]
    folders = {name: work / "adaptation" / name for name in ("a_general", "c_finetune")}
    args.models = {name: (MODELS[name][0], str(folder / "run")) for name, folder in folders.items()}
    args.recipe_overrides = {
        name: [*data, *common.SMOKE_TRAIN, f"data_dir={folder / 'data'}", f"run_dir={folder / 'run'}"]
        for name, folder in folders.items()
    }
    args.recipe_overrides["a_general"] += ["tokenizer.vocab_size=300", *common.SMOKE_MODEL]
    args.recipe_overrides["c_finetune"] += [f"train.init_from={folders['a_general'] / 'run'}"]
    args.tests = {
        "multi30k_test2016": (corpus / "test_2016_flickr.en.gz", corpus / "test_2016_flickr.fr.gz"),
        "tatoeba_test": (corpus / "val.en.gz", corpus / "val.fr.gz"),
    }


def run_study(args: argparse.Namespace) -> dict:
    """Train (unless --skip-training) and score each model in turn, printing a line for each."""
    commands = MtkitCommands(in_process=args.smoke)
    machine = platform.processor() or platform.machine()
    result = {**common.smoke_label(args), "date": datetime.date.today().isoformat(), "machine": machine, "models": {}}
    for name, (recipe, run) in args.models.items():
        started = time.monotonic()
        if not args.skip_training:
            train(commands, RECIPES / recipe, Path(run), args.recipe_overrides.get(name, []))
        scores = {test: score(commands, run, *files) for test, files in args.tests.items()}
        result["models"][name] = {
            "recipe": str(RECIPES / recipe),
            "run": run,
            **scores,
            "wall_s": round(time.monotonic() - started),
        }
        print(f"{name:<12} " + "  ".join(f"{t}: BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f}" for t, s in scores.items()))
    return result


def main() -> None:
    args = parse_args()
    common.measure_and_write(args, tiny_arguments, run_study, args.out)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
