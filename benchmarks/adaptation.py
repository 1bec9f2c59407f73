"""Domain adaptation, measured: a general Tatoeba en->fr model adapted to Multi30k image captions.

    python benchmarks/adaptation.py [--out benchmarks/results/adaptation.json] [--skip-training]

Runs the four recipes of recipes/tatoeba/ one after another (each alone on the machine: two of them
have a time budget) and scores every model on Multi30k test2016 (en->fr) and on the Tatoeba test set:
  (a) general_en_fr.yaml       the general model: 3,500 updates on 149,400 Tatoeba pairs (resumed if interrupted)
  (b) captions_scratch.yaml    from scratch on the first 5,000 Multi30k caption pairs, 10 minutes
  (c) captions_finetune.yaml   (a) fine-tuned on the same 5,000 caption pairs, 10 minutes
  (d) captions_mixed.yaml      (a) fine-tuned on the captions plus 5,000 general pairs an epoch, 10 minutes
Prints BLEU and chrF for each model and test set (beam 5) and writes them as JSON with the commands.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

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


def mtkit(*arguments: object) -> str:
    command = [sys.executable, "-m", "mtkit", *map(str, arguments)]
    print("$ mtkit " + " ".join(map(str, arguments)), file=sys.stderr, flush=True)
    return subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout


def train(recipe: Path, run: Path) -> None:
    """Prepare and train a recipe; a run that exists is resumed (a finished one stops at once)."""
    if (run / "last.pt").is_file():
        mtkit("train", recipe, "--resume")
        return
    if "init_from" not in recipe.read_text(encoding="utf-8"):
        mtkit("tokenizer", "train", recipe)
    mtkit("prepare", recipe)
    mtkit("train", recipe, "--overwrite")


def score(run: str, source: Path, reference: Path) -> dict[str, float]:
    report = json.loads(mtkit("evaluate", "-m", run, "--src", source, "--ref", reference, "--beam", 5, "--json"))
    return {"bleu": round(report["scores"]["BLEU"]["score"], 2), "chrf": round(report["scores"]["chrF"]["score"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/adaptation.json"))
    parser.add_argument("--skip-training", action="store_true", help="score the runs as they are")
    args = parser.parse_args()
    result = {"date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(), "models": {}}
    for name, (recipe, run) in MODELS.items():
        started = time.monotonic()
        if not args.skip_training:
            train(RECIPES / recipe, Path(run))
        scores = {test: score(run, *files) for test, files in TESTS.items()}
        result["models"][name] = {
            "recipe": str(RECIPES / recipe),
            "run": run,
            **scores,
            "wall_s": round(time.monotonic() - started),
        }
        print(f"{name:<12} " + "  ".join(f"{t}: BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f}" for t, s in scores.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
