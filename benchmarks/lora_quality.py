"""LoRA against full fine-tuning, in quality: a general Tatoeba en->fr parent adapted to Multi30k captions.

    python -m benchmarks.lora_quality [--parent-steps 3500] [--steps 400] [--ranks 8,32,128] [--lora-lr 0.002]
        [--lora-targets qkv,query,key_value,out,inner,outer]
        [--out benchmarks/results/lora_quality.json] [--skip-training] [--smoke]

1. The parent: recipes/tatoeba/general_en_fr.yaml for `--parent-steps` updates (its own 3,500 by default; another
   count trains runs/tatoeba_general_en_fr_<N>), resumed if interrupted, reused if done; the children go in
   runs/lora_quality/.
2. Its children, each for the same `--steps` updates of recipes/tatoeba/captions_finetune.yaml (5,000 caption pairs,
   a step budget instead of its 10 minutes): every weight fine-tuned at the recipe's learning rate, and LoRA at
   each of `--ranks` (alpha twice the rank; `--lora-targets`, else train.lora's default: the attention projections)
   at `--lora-lr`, which adapters need higher than full fine-tuning does.
3. Every model scored on Multi30k test2016 (the new domain) and on Tatoeba's test set (the parent's domain: what
   is kept), beam 5, by `mtkit evaluate --compare` with full fine-tuning first, so each LoRA child gets paired
   bootstrap and approximate-randomisation p-values against it.
Prints BLEU and chrF, each LoRA child's share of full fine-tuning's BLEU gain over the parent on captions, and writes
JSON. `--smoke`: tiny models on the tests' slice (its validation split stands in for Tatoeba's test), in this process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

from benchmarks import common
from benchmarks.adaptation import RECIPES, TESTS, train
from benchmarks.common import MtkitCommands

PARENT, CHILD = RECIPES / "general_en_fr.yaml", RECIPES / "captions_finetune.yaml"
PARENT_STEPS = 3500  # the parent recipe's own budget


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent-steps", type=int, default=PARENT_STEPS)
    parser.add_argument("--steps", type=int, default=400, help="updates of every child")
    parser.add_argument("--ranks", default="8,32,128")
    parser.add_argument("--lora-lr", type=float, default=0.002)
    parser.add_argument("--lora-targets", default=None, help="train.lora.targets, comma-separated (default: the key's)")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/lora_quality.json"))
    parser.add_argument("--skip-training", action="store_true", help="score the runs as they are")
    common.add_smoke_options(parser)
    parser.set_defaults(
        tests=TESTS, parent_overrides=[], child_overrides=[], parent_runs=Path("runs"), runs=Path("runs/lora_quality")
    )
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: a tiny parent and children on the first lines of the tests' slice, in `work`."""
    corpus = common.smoke_corpus(work)
    splits = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
    data = [f"data.{key}={{src: {corpus}/{name}.en.gz, tgt: {corpus}/{name}.fr.gz}}" for key, name in splits.items()]
    args.runs, args.parent_runs, args.steps, args.ranks = work / "lora_quality", work / "lora_quality", 10, "2"
    args.parent_overrides = [*data, *common.SMOKE_TRAIN, "tokenizer.vocab_size=300", *common.SMOKE_MODEL]
    args.child_overrides = [*data, *common.SMOKE_TRAIN]
    args.tests = {
        "multi30k_test2016": (corpus / "test_2016_flickr.en.gz", corpus / "test_2016_flickr.fr.gz"),
        "tatoeba_test": (corpus / "val.en.gz", corpus / "val.fr.gz"),
    }


def children(args: argparse.Namespace, parent: Path) -> dict[str, list[str]]:
    """Each child's name and recipe overrides (its run and data folders, budget, learning rate, adapters)."""
    common_overrides = [
        *args.child_overrides,
        f"train.init_from={parent}",
        "train.max_time=null",
        f"train.max_steps={args.steps}",
    ]
    found = {"full": []}
    targets = f", targets: [{args.lora_targets}]" if args.lora_targets else ""
    named = f"_{args.lora_targets.replace(',', '_')}" if args.lora_targets else ""
    for rank in (int(rank) for rank in args.ranks.split(",")):
        lora = f"train.lora={{rank: {rank}, alpha: {2 * rank}{targets}}}"
        found[f"lora_r{rank}{named}"] = [f"train.lr={args.lora_lr}", lora]
    return {
        name: [*common_overrides, *extra, f"run_dir={args.runs / name}", f"data_dir={args.runs / 'captions_data'}"]
        for name, extra in found.items()
    }


def scores(commands: MtkitCommands, runs: list[Path], source: Path, reference: Path) -> dict:
    """BLEU and chrF of each run, and paired tests of each against the first (`mtkit evaluate --compare --json`)."""
    models = [word for run in runs for word in ("-m", run)]
    report = json.loads(
        commands.run(["evaluate", *models, "--compare", "--src", source, "--ref", reference, "--beam", 5, "--json"])
    )
    by_run = {
        str(run): {"bleu": round(s["scores"]["BLEU"]["score"], 2), "chrf": round(s["scores"]["chrF"]["score"], 2)}
        for run, s in zip(runs, report["systems"], strict=True)
    }
    return {"systems": by_run, "comparison": report["comparison"]}


def run_study(args: argparse.Namespace) -> dict:
    """Train the parent and its children (unless --skip-training), score them, and the share of the gain kept."""
    commands = MtkitCommands(in_process=args.smoke)
    suffix = "" if args.parent_steps == PARENT_STEPS else f"_{args.parent_steps}"
    parent = args.parent_runs / f"tatoeba_general_en_fr{suffix}"
    kids = children(args, parent)
    if not args.skip_training:
        parent_overrides = [*args.parent_overrides, f"train.max_steps={args.parent_steps}", f"run_dir={parent}",
                            f"data_dir={args.parent_runs / 'tatoeba_data'}"]  # fmt: skip
        train(commands, PARENT, parent, parent_overrides)
        for name, overrides in kids.items():
            train(commands, CHILD, args.runs / name, overrides)
    runs = [args.runs / name for name in kids] + [parent]  # full fine-tuning first: the baseline of the tests
    tested = {test: scores(commands, runs, *files) for test, files in args.tests.items()}
    return {
        **common.smoke_label(args),
        "date": datetime.date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
        "parent": {"recipe": str(PARENT), "run": str(parent), "steps": args.parent_steps},
        "children": {"recipe": str(CHILD), "steps": args.steps, "lora_lr": args.lora_lr, "overrides": kids},
        "tests": tested,
        "gain_kept": gain_kept(tested["multi30k_test2016"]["systems"], parent=str(parent), full=str(args.runs / "full")),
    }


def gain_kept(systems: dict[str, dict], *, parent: str, full: str) -> dict[str, float | None]:
    """Each run's BLEU gain over the parent as a share of full fine-tuning's."""
    gain = systems[full]["bleu"] - systems[parent]["bleu"]
    return {
        run: round((s["bleu"] - systems[parent]["bleu"]) / gain, 3) if gain else None
        for run, s in systems.items()
        if run != parent
    }


def print_table(report: dict) -> None:
    tests = report["tests"]
    print(f"{'run':<44} " + "  ".join(f"{test:>26}" for test in tests) + "  gain kept")
    for run in tests["multi30k_test2016"]["systems"]:
        cells = [f"BLEU {tests[t]['systems'][run]['bleu']:6.2f} chrF {tests[t]['systems'][run]['chrf']:6.2f}" for t in tests]
        kept = report["gain_kept"].get(run)
        print(f"{run:<44} " + "  ".join(f"{cell:>26}" for cell in cells) + (f"  {100 * kept:.1f}%" if kept is not None else ""))


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, run_study, args.out)
    print_table(report)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
