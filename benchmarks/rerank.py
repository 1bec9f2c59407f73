"""Minimum-Bayes-risk reranking, measured: does MBR with chrF over a beam's 8-best beat the beam's 1-best?

    python -m benchmarks.rerank [-m runs/multi30k_demo] [--candidates 8] [--out benchmarks/results/rerank.json] [--smoke]

Translates Multi30k test2016 (de->en) with the model twice, as a user would: `mtkit translate --beam 8` (the
1-best) and `mtkit translate --beam 8 --rerank mbr --candidates 8` (the candidate the others agree with most, by
sentence chrF), then compares the two with `mtkit evaluate` (BLEU, chrF, TER, with the paired bootstrap and
approximate randomisation tests, the 1-best the baseline). Prints the scores, the p-values and each translation's
wall time, and writes them as JSON. Run it alone on the machine: the wall times are part of the report.
`--smoke`: the tiny model and the test lines of the tests' own slice, the commands run in this process.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import platform
import time
from pathlib import Path

from benchmarks import common
from benchmarks.common import MtkitCommands

DATA = Path("../shared/data/multi30k")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, default=Path("runs/multi30k_demo"), help="the `make demo` run")
    parser.add_argument("--src", type=Path, default=DATA / "test_2016_flickr.de.gz")
    parser.add_argument("--ref", type=Path, default=DATA / "test_2016_flickr.en.gz")
    parser.add_argument("--candidates", type=int, default=8, help="the beam size, and the n-best MBR chooses among")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/rerank.json"))
    parser.add_argument("--work", type=Path, default=Path("benchmarks/results/rerank"), help="translations written here")
    common.add_smoke_options(parser)
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny model, its test lines, four candidates."""
    args.model = common.smoke_run(work)
    corpus = common.smoke_corpus(work)
    args.src, args.ref = corpus / "test_2016_flickr.de.gz", corpus / "test_2016_flickr.en.gz"
    args.candidates, args.work = 4, work / "rerank"


def plain(path: Path, folder: Path) -> Path:
    """A text file of `path`'s lines (gunzipped into `folder` when it is .gz)."""
    if path.suffix != ".gz":
        return path
    target = folder / path.stem
    target.write_bytes(gzip.decompress(path.read_bytes()))
    return target


def translate(commands: MtkitCommands, args: argparse.Namespace, source: Path, output: Path, *flags: object) -> float:
    """Seconds `mtkit translate` took at beam `--candidates` with `flags`."""
    started = time.monotonic()
    commands.run(["translate", "-m", args.model, "-i", source, "-o", output, "--beam", args.candidates, *flags])
    return round(time.monotonic() - started, 1)


def measure(args: argparse.Namespace) -> dict:
    """The 1-best and the MBR choice, translated, then compared by `mtkit evaluate`."""
    commands = MtkitCommands(in_process=args.smoke)
    args.work.mkdir(parents=True, exist_ok=True)
    source, reference = plain(args.src, args.work), plain(args.ref, args.work)
    best, mbr = args.work / "beam_1best.txt", args.work / "mbr_chrf.txt"
    seconds = {
        "beam_1best": translate(commands, args, source, best),
        "mbr_chrf": translate(commands, args, source, mbr, "--rerank", "mbr", "--candidates", args.candidates),
    }
    report = json.loads(commands.run(["evaluate", "--hyp", best, "--hyp", mbr, "--ref", reference, "--json"]))
    comparison = report["comparison"]
    rows = {
        name: {metric: {key: scores[n][key] for key in ("score", "p_bootstrap", "p_randomisation")}
               for metric, scores in comparison["scores"].items()} | {"translate_s": seconds[name]}
        for n, name in enumerate(seconds)
    }  # fmt: skip
    for name, row in rows.items():
        print(f"{name:<11} " + "  ".join(_shown(metric, row[metric]) for metric in comparison["scores"]), end="")
        print(f"  translate {row['translate_s']} s")
    return {
        **common.smoke_label(args),
        "date": datetime.date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
        "model": str(args.model),
        "test": str(args.src),
        "sentences": report["systems"][0]["num_sentences"],
        "candidates": args.candidates,
        "systems": rows,
        "paired_tests": {key: comparison[key] for key in ("seed", "bootstrap_samples", "randomisation_trials")},
        **common.machine_facts(),
    }


def _shown(metric: str, score: dict) -> str:
    """`chrF 58.12 (p 0.0010 / 0.0001)`: the score and the bootstrap and randomisation p-values (none: the baseline)."""
    tests = "" if score["p_bootstrap"] is None else f" (p {score['p_bootstrap']:.4f} / {score['p_randomisation']:.4f})"
    return f"{metric} {score['score']:.2f}{tests}"


def main() -> None:
    args = parse_args()
    common.measure_and_write(args, tiny_arguments, measure, args.out)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
