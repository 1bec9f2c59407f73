"""Where a decoding step of a small model goes: ops per step and the profiler's shares, greedy and beam 5.

    python -m benchmarks.decode_steps --model RUN_DIR [--sentences 200] [--cap 100] [--lang de] [--top 15]
        [--threads 0] [--output benchmarks/results/decode_steps.json] [--smoke]

Loads the run as every front end does (`Translator.load(..., fast_paths=True)`) and translates the first
--sentences Multi30k test2016 sources (German unless --lang), every output capped at --cap pieces as `make peers`
caps them, at beam 5 and greedy, each once unprofiled (the warm-up) and once under torch.profiler. For each search
it reports the decoder steps (calls of the model's `decode`), the output pieces (EOS counted once a sentence, as
speed.py counts), and per step: the ops (aten's, oneDNN's) called from Python (top-level: no op above them), split into
those inside the model's `decode` and those of the search around it (and the pipeline's, a few per batch), and
every op dispatched (nested ones included). Then the profiler's self-CPU time by op (the --top largest,
as shares), and the share of the profiled wall time spent outside any op (Python: search bookkeeping,
module calls, the pipeline). Op counts do not depend on the machine's load; the shares roughly; the seconds do
(reported only beside the counts, not to compare).
`--smoke` (no --model needed): the tiny model on 10 sentences.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch.autograd.profiler_util import FunctionEvent

from benchmarks import common
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.runtime import set_threads

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
STEP_LABEL = "decoder step"  # the profiler's label around each call of the model's decode


class StepCounter:
    """Wraps a model's `decode` (on the instance): counts its calls, each under the profiler label `STEP_LABEL`."""

    def __init__(self, decode: Callable) -> None:
        self.decode, self.calls = decode, 0

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204 - the model's own signature, passed on
        self.calls += 1
        with torch.profiler.record_function(STEP_LABEL):
            return self.decode(*args, **kwargs)


def is_op(event: FunctionEvent) -> bool:
    """Whether a profiler event is an operator (aten::, mkldnn::, ...), not a label such as `STEP_LABEL`."""
    return "::" in event.name


def op_counts(events: list[FunctionEvent]) -> dict[str, int]:
    """Top-level ops (no op above them), split into those inside `STEP_LABEL` and the rest, and every op; with the
    top-level ops' CPU time (µs), which leaves the rest of the wall time to Python."""
    counts = Counter()
    top_level_us = 0.0
    for event in events:
        if not is_op(event):
            continue
        counts["all"] += 1
        parent, in_step = event.cpu_parent, False
        while parent is not None and not is_op(parent):
            in_step = in_step or parent.name == STEP_LABEL
            parent = parent.cpu_parent
        if parent is None:
            counts["decode" if in_step else "search"] += 1
            top_level_us += event.cpu_time_total
    return {"top_level_decode": counts["decode"], "top_level_search": counts["search"], "all": counts["all"],
            "top_level_us": round(top_level_us)}  # fmt: skip


def self_cpu_shares(profiler: torch.profiler.profile, wall_us: float, top: int) -> dict[str, float]:
    """The `top` ops by self-CPU time, each as a share of the profiled wall time."""
    averages = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    largest = [e for e in averages if e.key != STEP_LABEL][:top]
    return {e.key: round(e.self_cpu_time_total / wall_us, 4) for e in largest}


def measure_search(translator: Translator, sources: list[str], beam: int, top: int) -> dict:
    """One warm-up translation of `sources` at `beam`, then one under the profiler: steps, pieces, ops and shares."""
    model = translator.engine.model
    counter = model.decode = StepCounter(model.decode)
    try:
        start = time.perf_counter()
        found = translator.translate_nbest(sources, Decoding(beam=beam))
        seconds = time.perf_counter() - start
        counter.calls = 0
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            start = time.perf_counter()
            profiled = translator.translate_nbest(sources, Decoding(beam=beam))
            wall_us = (time.perf_counter() - start) * 1e6
    finally:
        del model.decode  # the class's method again
    assert [h[0].tokens for h in found] == [h[0].tokens for h in profiled], "the same outputs twice"
    steps, counts = counter.calls, op_counts(profiler.events())
    return {
        "steps": steps,
        "output_pieces": sum(len(h[0].tokens) + 1 for h in found),
        "ops_per_step": {
            "top_level": round((counts["top_level_decode"] + counts["top_level_search"]) / steps, 1),
            "in_decode": round(counts["top_level_decode"] / steps, 1),
            "outside_decode": round(counts["top_level_search"] / steps, 1),
            "all_nested": round(counts["all"] / steps, 1),
        },
        "python_share": round(1 - counts["top_level_us"] / wall_us, 3),
        "self_cpu_share": self_cpu_shares(profiler, wall_us, top),
        "seconds_unprofiled": round(seconds, 2),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a run directory (PyTorch engine); required but with --smoke")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--cap", type=int, default=100, help="most output pieces of every sentence (make peers: 100)")
    parser.add_argument("--lang", default="de", help="source language of the test2016 sentences (de, en, fr, cs)")
    parser.add_argument("--top", type=int, default=15, help="ops listed by self-CPU time")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core, as make peers runs)")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/decode_steps.json"))
    parser.set_defaults(data=DATA)  # --smoke reads the tests' slice
    return common.parsed_with_model(parser)


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny model (trained in `work` the first time) on 10 sentences."""
    args.model, args.data, args.sentences = common.smoke_run(work), common.smoke_corpus(work), 10


def run_benchmark(args: argparse.Namespace) -> dict:
    """Greedy and beam 5 of the same sentences, each measured by `measure_search`."""
    set_threads(args.threads)
    sources = common.first_lines(args.data / f"test_2016_flickr.{args.lang}.gz", args.sentences)
    translator = Translator.load(args.model, device="cpu", fast_paths=True)
    translator.decode = replace(translator.decode, max_len_a=0.0, max_len_b=args.cap)
    report = {**common.smoke_label(args), "date": datetime.date.today().isoformat(), "model": str(args.model)}
    report |= {"machine": common.machine_facts(), "sentences": len(sources), "cap": args.cap}
    for name, beam in (("greedy", 1), ("beam5", 5)):
        report[name] = measure_search(translator, sources, beam, args.top)
    return report


def print_report(report: dict) -> None:
    for name in ("greedy", "beam5"):
        found = report[name]
        ops = found["ops_per_step"]
        print(f"{name}: {found['steps']} steps, {found['output_pieces']} output pieces; ops per step "
              f"{ops['top_level']} top-level ({ops['in_decode']} in decode, {ops['outside_decode']} outside), "
              f"{ops['all_nested']} with nested ones; Python outside ops {found['python_share']:.1%}")  # fmt: skip
        for op, share in found["self_cpu_share"].items():
            print(f"    {share:7.1%}  {op}")


def main() -> None:
    args = parse_args()
    print_report(common.measure_and_write(args, tiny_arguments, run_benchmark, args.output))


if __name__ == "__main__":
    main()
