"""Micro-benchmark of mtkit's hand-fused training ops against the PyTorch ops they replace.

    python -m benchmarks.ops [--tokens 3500] [--vocab 8000] [--width 1024] [--threads 0] [--smoke]

Forward + backward, at the shapes of one Multi30k Transformer update (~3,500 target tokens, an
8,000-piece vocabulary, the 1,024-wide feed-forward activation): mtkit's label-smoothed loss
against `F.cross_entropy(label_smoothing=...)`, and mtkit's `Dropout` against `F.dropout` and the
uniform-float masks it drew before (`rand_like(x) >= p`). The sides are timed alternately in one
run (best of several rounds), so the ratios hold on a noisy machine. Prints a table and writes
JSON (default benchmarks/results/ops.json). `--smoke`: tiny shapes, one thread, one round.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks import common
from mtkit.data.tokenizer import PAD_ID
from mtkit.models.layers import Dropout
from mtkit.runtime import retain_freed_memory, set_threads
from mtkit.training.loss import sequence_loss


def best_seconds(step: Callable[[], None], rounds: int, repeats: int) -> float:
    """The fastest of `rounds` timings of `repeats` calls, per call."""
    step()  # warm-up
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def loss_steps(tokens: int, vocab: int) -> dict[str, Callable[[], None]]:
    logits = torch.randn(tokens, vocab, requires_grad=True)
    target = torch.randint(4, vocab, (tokens,))
    target[: tokens // 50] = PAD_ID

    def reference() -> None:
        logits.grad = None
        F.cross_entropy(logits, target, ignore_index=PAD_ID, label_smoothing=0.1, reduction="sum").backward()

    def mtkit() -> None:
        logits.grad = None
        sequence_loss(logits, target, label_smoothing=0.1).backward()

    return {"F.cross_entropy": reference, "mtkit.training.loss.sequence_loss": mtkit}


def dropout_steps(tokens: int, width: int) -> dict[str, Callable[[], None]]:
    x = torch.randn(tokens, width, requires_grad=True)
    grad = torch.randn(tokens, width)
    dropout = Dropout(0.3).train()

    def reference() -> None:
        F.dropout(x, 0.3, training=True).backward(grad)

    def float_mask() -> None:  # mtkit's CPU masks until stop 27: one uniform float per value
        (x * torch.rand_like(x).ge_(0.3).div_(0.7)).backward(grad)

    def mtkit() -> None:
        dropout(x).backward(grad)

    return {"F.dropout": reference, "float mask": float_mask, "mtkit Dropout": mtkit}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=3500)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = one per core)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/ops.json"))
    common.add_smoke_options(parser)
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: shapes of a few hundred values, one thread, one round (`work` is not needed)."""
    args.tokens, args.vocab, args.width, args.threads, args.rounds = 64, 100, 32, 1, 1


def run_benchmark(args: argparse.Namespace) -> dict:
    """Each case's sides timed alternately, twice over; prints a line a case."""
    set_threads(args.threads)
    retain_freed_memory()  # as `mtkit train` does on CPU: no page faults for re-allocated tensors
    report = {**common.smoke_label(args), "threads": torch.get_num_threads(), "torch": torch.__version__, "ops": {}}
    cases = {
        f"label-smoothed loss, {args.tokens} x {args.vocab}": loss_steps(args.tokens, args.vocab),
        f"dropout 0.3, {args.tokens} x {args.width}": dropout_steps(args.tokens, args.width),
    }
    for case, steps in cases.items():
        times = {name: float("inf") for name in steps}
        for _ in range(2):  # alternate the sides so drift in machine speed hits all of them
            for name, step in steps.items():
                times[name] = min(times[name], best_seconds(step, args.rounds, 3))
        names = list(steps)  # PyTorch's op first, mtkit's last
        reference, mtkit = times[names[0]], times[names[-1]]
        milliseconds = {name: round(1e3 * t, 2) for name, t in times.items()}
        report["ops"][case] = {"ms": milliseconds, "speedup": round(reference / mtkit, 2)}
        print(f"{case}: " + ", ".join(f"{name} {1e3 * t:.1f} ms" for name, t in times.items()) + f" -> {reference / mtkit:.2f}x")
    return report


def main() -> None:
    args = parse_args()
    common.measure_and_write(args, tiny_arguments, run_benchmark, args.output)
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
