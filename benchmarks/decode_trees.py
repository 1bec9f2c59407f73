"""Decoding speed of two checkouts of mtkit side by side: old and new, in turns, each run a process of its own.

    python -m benchmarks.decode_trees --model RUN_DIR --trees OLD_TREE,NEW_TREE [--sentences 1000] [--cap 100]
        [--repeats 2] [--data ../shared/data/multi30k] [--lang de] [--out benchmarks/results/decode_trees.json]
        [--smoke]

Each turn runs this script's child in a fresh interpreter with `PYTHONPATH=TREE`, so that it decodes with that
tree's `mtkit` (the script itself needs nothing newer than `Translator.load(..., fast_paths=True)` and
`translate_nbest`): the run loaded as every front end loads it, the first `--sentences` test2016 sources (German
unless --lang) translated at beam 5 and greedy, without the run's shortlist, every output capped at `--cap`
pieces as `make peers` caps them, once to warm up on 50 and once timed. The trees take turns (A B A B ...).
Reported per tree and turn: seconds, output pieces/s (EOS counted once a sentence) and an MD5 of the outputs'
text (equal digests: the same translations); then the mean ratio of each tree to the first, with the matmul peak
before and after. Run it on an otherwise idle machine.
`--smoke` (no --model or --trees needed): the tiny model on 10 sentences, this tree against itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SEARCHES = {"beam5": 5, "greedy": 1}


def child(task: dict) -> dict:
    """One tree's turn: the run loaded, warmed up, each search timed once (imports the tree's mtkit)."""
    from mtkit.decoding.options import Decoding
    from mtkit.decoding.translator import Translator

    translator = Translator.load(Path(task["model"]), fast_paths=True)
    translator.decode = dataclasses.replace(translator.decode, max_len_a=0.0, max_len_b=task["cap"])
    sources, found = task["sources"], {}
    for name, beam in SEARCHES.items():
        decoding = Decoding(beam=beam, shortlist=False)
        translator.translate_nbest(sources[:50], decoding)
        start = time.perf_counter()
        best = [nbest[0] for nbest in translator.translate_nbest(sources, decoding)]
        seconds = time.perf_counter() - start
        pieces = sum(len(hypothesis.tokens) + 1 for hypothesis in best)
        digest = hashlib.md5("\n".join(hypothesis.text for hypothesis in best).encode("utf-8")).hexdigest()
        found[name] = {"seconds": round(seconds, 3), "pieces_per_s": round(pieces / seconds, 1), "md5": digest}
    return found


def turn(tree: Path, task: dict) -> dict:
    """`child(task)` in a fresh interpreter whose `mtkit` is `tree`'s."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(task)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_benchmark(args: argparse.Namespace) -> dict:
    """The trees in turns, then each one's mean ratio to the first."""
    from benchmarks import common

    path = args.data / f"test_2016_flickr.{args.lang}.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        sources = [line.rstrip("\n") for _, line in zip(range(args.sentences), handle, strict=False)]
    task = {"model": str(args.model.resolve()), "cap": args.cap, "sources": sources}
    report = {**common.smoke_label(args), "date": datetime.date.today().isoformat(), "machine": common.machine_facts()}
    report |= {"model": str(args.model), "sentences": len(sources), "cap": args.cap, "trees": [str(t) for t in args.trees]}
    report["matmul_gflop_per_s"] = common.matmul_gflop_per_s(smoke=args.smoke)
    report["turns"] = [{"tree": str(tree), **turn(tree, task)} for _ in range(args.repeats) for tree in args.trees]
    report["matmul_gflop_per_s_after"] = common.matmul_gflop_per_s(smoke=args.smoke)
    report["ratios"] = ratios(report["turns"], args.trees)
    return report


def ratios(turns: list[dict], trees: list[Path]) -> dict:
    """Each tree's mean pieces/s over the first tree's, per search."""

    def mean(tree: Path, search: str) -> float:
        figures = [found[search]["pieces_per_s"] for found in turns if found["tree"] == str(tree)]
        return sum(figures) / len(figures)

    return {str(tree): {s: round(mean(tree, s) / mean(trees[0], s), 3) for s in SEARCHES} for tree in trees}


def parse_args() -> argparse.Namespace:
    from benchmarks import common

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help="a trained run (required but with --smoke)")
    parser.add_argument("--trees", type=lambda text: [Path(t) for t in text.split(",")], help="OLD,NEW checkouts")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/multi30k"))
    parser.add_argument("--lang", default="de", help="the sources' language (test_2016_flickr.LANG.gz)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--cap", type=int, default=100, help="output pieces at most")
    parser.add_argument("--repeats", type=int, default=2, help="turns of each tree")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/decode_trees.json"))
    common.add_smoke_options(parser)
    args = parser.parse_args()
    if args.child is None and not args.smoke and (args.model is None or not args.trees):
        parser.error("--model and --trees are required (but with --smoke)")
    return args


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny model, this tree against itself, 10 sentences, one turn each."""
    from benchmarks import common

    args.model, args.data, args.sentences, args.repeats = common.smoke_run(work), common.smoke_corpus(work), 10, 1
    args.trees = [Path(__file__).resolve().parents[1]] * 2


def main() -> None:
    args = parse_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return
    from benchmarks import common

    report = common.measure_and_write(args, tiny_arguments, run_benchmark, args.out)
    for found in report["turns"]:
        figures = (f"{s} {found[s]['pieces_per_s']:.1f} pieces/s ({found[s]['md5'][:8]})" for s in SEARCHES)
        print(f"{found['tree']}: " + ", ".join(figures))
    for tree, ratio in report["ratios"].items():
        print(f"{tree} / {report['trees'][0]}: " + ", ".join(f"{s} {value:.2f}x" for s, value in ratio.items()))
    peaks = f"{report['matmul_gflop_per_s']:.0f} / {report['matmul_gflop_per_s_after']:.0f}"
    print(f"matmul peak {peaks} GFLOP/s; written to {args.out}")


if __name__ == "__main__":
    main()
