"""COMET scoring speed: mtkit's scorer (mtkit.evaluation.comet) against unbabel-comet's on the same checkpoint.

    python -m benchmarks.comet_speed [--comet-python /work/venvs/comet/bin/python] [--sentences 500] [--repeats 3]
                                     [--threads 0] [--output benchmarks/results/comet_speed.json] [--smoke]

unbabel-comet pins transformers < 5, so it runs in an environment of its own (how to make one:
tests/evaluation/make_comet_reference.py); `--comet-python` is its interpreter. That environment builds a
RegressionMetric checkpoint (wmt22-comet-da's class and estimator) over a random encoder of XLM-R base's shape
(hidden 768, 12 layers, 12 heads, FFN 3072, 250,002 embeddings) with benchmarks/comet_build.py; both systems
then score the same Multi30k test2016 triples (German source, an English sentence as the translation, the
English reference), batches of 16, each in a process of its own (loaded, warmed up on one batch, timed once),
taking turns A B A B. Prints sentences/s and the ratio with the matmul peak of the same run, and writes JSON;
the two system scores are printed too, as a check that both computed the same thing.
`--smoke`: the tests' tiny regression checkpoint (tests/fixtures/comet/), 32 sentences, mtkit's turn alone (and
unbabel-comet's when `--comet-python` is given), once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import common

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
BUILDER = Path(__file__).resolve().parent / "comet_build.py"
BASE = {"hidden": 768, "layers": 12, "heads": 12, "ffn": 3072, "vocab": 250002}
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "comet"
SYSTEMS = ("unbabel-comet", "mtkit")
COMET_PYTHON = Path("/work/venvs/comet/bin/python")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comet-python", type=Path, default=None, help=f"(default {COMET_PYTHON}; with --smoke, none)")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads in each system (0: all cores)")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/comet_speed.json"))
    common.add_smoke_options(parser)
    args = parser.parse_args()
    args.shape, args.threads, args.checkpoint, args.data = BASE, args.threads or torch.get_num_threads(), None, DATA
    if args.comet_python is None and not args.smoke:
        args.comet_python = COMET_PYTHON
    return args


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    # (folder, encoder folder, the folder its relative pretrained_model is found from)
    args.checkpoint = (FIXTURES / "regression", FIXTURES / "tiny-xlmr", FIXTURES)
    args.shape, args.sentences, args.repeats = "tests/fixtures/comet/regression", 32, 1
    args.data = common.SMOKE_SOURCE  # the tests' own slice: a clone alone runs the smoke mode


def triples(data: Path, count: int) -> dict[str, list[str]]:
    """Multi30k test2016 in `data`: German sources, English references, and as translations the references one
    line on."""
    src, ref = (common.first_lines(data / f"test_2016_flickr.{lang}.gz", count) for lang in ("de", "en"))
    return {"src": src, "mt": ref[1:] + ref[:1], "ref": ref}


def run_comet(args: argparse.Namespace, checkpoint: tuple[Path, Path, Path], pairs: Path) -> dict:
    folder, _, workdir = checkpoint
    command = [str(args.comet_python), str(BUILDER), "score", str(folder), str(pairs), str(args.threads), str(workdir)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)  # lightning's banners kept out
    if done.returncode:
        raise SystemExit(f"unbabel-comet's turn failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_mtkit(args: argparse.Namespace, checkpoint: tuple[Path, Path, Path], pairs: Path) -> dict:
    folder, encoder, _ = checkpoint
    command = [
        sys.executable,
        "-m",
        "benchmarks.comet_speed",
        "--child",
        str(folder),
        str(encoder),
        str(pairs),
        str(args.threads),
    ]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def child(folder: Path, encoder: Path, pairs: Path, threads: int) -> None:
    """One mtkit turn: the scorer loaded, warmed up on one batch, then timed over every triple."""
    from mtkit.evaluation.comet.options import CometOptions
    from mtkit.evaluation.comet.scorer import CometScorer

    torch.set_num_threads(threads)
    rows = json.loads(pairs.read_text(encoding="utf-8"))
    scorer = CometScorer.load(CometOptions(model=str(folder), encoder=encoder, device="cpu"))
    scorer.score(rows["src"][:16], rows["mt"][:16], references=rows["ref"][:16])
    start = time.perf_counter()
    scores = scorer.score(rows["src"], rows["mt"], references=rows["ref"])
    print(json.dumps({"seconds": time.perf_counter() - start, "system_score": sum(scores) / len(scores)}))


def measure(args: argparse.Namespace) -> dict:
    comet = args.comet_python is not None and args.comet_python.is_file()
    if not comet and not args.smoke:
        raise SystemExit(f"--comet-python {args.comet_python}: not found; make unbabel-comet's environment first "
                         "(tests/evaluation/make_comet_reference.py says how)")  # fmt: skip
    systems = SYSTEMS if comet else ("mtkit",)
    peak = common.matmul_gflop_per_s(smoke=args.smoke)
    with tempfile.TemporaryDirectory(prefix="mtkit-comet-speed-") as scratch:
        pairs = Path(scratch) / "pairs.json"
        checkpoint = args.checkpoint or build(args, Path(scratch) / "checkpoint")
        pairs.write_text(json.dumps(triples(args.data, args.sentences), ensure_ascii=False), encoding="utf-8")
        turns: dict[str, list[dict]] = {name: [] for name in systems}
        for _ in range(args.repeats):
            for name in systems:
                turns[name].append((run_comet if name == "unbabel-comet" else run_mtkit)(args, checkpoint, pairs))
    rates = {name: [args.sentences / turn["seconds"] for turn in found] for name, found in turns.items()}
    medians = {name: statistics.median(found) for name, found in rates.items()}
    return {
        **common.smoke_label(args),
        "machine": {**common.machine_facts(), "threads": args.threads, "matmul_gflop_per_s": peak},
        "checkpoint": args.shape,
        "sentences": args.sentences,
        "sentences_per_s": {name: [round(rate, 2) for rate in found] for name, found in rates.items()},
        "system_scores": {name: [round(turn["system_score"], 6) for turn in found] for name, found in turns.items()},
        "ratio_mtkit_over_comet": round(medians["mtkit"] / medians["unbabel-comet"], 3) if comet else None,
    }


def build(args: argparse.Namespace, folder: Path) -> tuple[Path, Path, Path]:
    """The XLM-R-base-shaped checkpoint, built in unbabel-comet's environment: (folder, encoder, working folder)."""
    command = [str(args.comet_python), str(BUILDER), "build", str(folder), *map(str, args.shape.values())]
    subprocess.run(command, check=True, capture_output=True)
    return folder, folder / "encoder", folder


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]))
        return
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, measure, args.output)
    print(f"matmul peak {report['machine']['matmul_gflop_per_s']} GFLOP/s, {report['machine']['threads']} threads")
    for name in report["sentences_per_s"]:
        rates = ", ".join(f"{rate:.1f}" for rate in report["sentences_per_s"][name])
        print(f"{name:14} sentences/s {rates}; system score {report['system_scores'][name]}")
    ratio = report["ratio_mtkit_over_comet"]
    print(f"mtkit / unbabel-comet (medians): {ratio}x" if ratio else "mtkit alone (no unbabel-comet environment: --comet-python)")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
