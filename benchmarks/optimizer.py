"""Time of one Adam step for a recipe's model: torch's per-tensor loop against its fused kernel.

    python -m benchmarks.optimizer recipes/multi30k/demo.yaml [--set KEY=VALUE ...] [--rounds 3]
        [--steps 20] [--output benchmarks/results/optimizer.json] [--smoke]

The model is built from the recipe (vocabulary from `tokenizer.vocab_size`), every parameter gets
a random gradient, and the two optimisers alternate A B A B ... for `--rounds` rounds of `--steps`
steps each, so drift shows; the figure of each is its best round. `mtkit train` uses the fused one
where torch has it (CUDA; CPU from torch 2.4). The fp32 matmul peak is measured in the same run.
`--smoke` (no recipe needed): the tiny recipe's model, 2 rounds of 2 steps.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
from pathlib import Path

import torch

from benchmarks import common
from mtkit.config import load_config
from mtkit.models import build_model


def step_ms(parameters: list[torch.nn.Parameter], fused: bool, steps: int) -> float:
    """Milliseconds per Adam step (the recipe trainer's betas and eps), after three warm-up steps."""
    optimizer = torch.optim.Adam(parameters, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=False, fused=fused or None)
    for _ in range(3):
        optimizer.step()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - start) / steps * 1000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", type=Path, nargs="?", help="the recipe (none with --smoke)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/optimizer.json"))
    common.add_smoke_options(parser)
    args = parser.parse_args()
    if args.recipe is None and not args.smoke:
        parser.error("the following arguments are required: recipe")
    return args


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny recipe (written in `work` the first time), 2 rounds of 2 steps."""
    args.recipe, args.rounds, args.steps = common.smoke_recipe(work), 2, 2


def run_benchmark(args: argparse.Namespace) -> dict:
    """The recipe's model with random gradients; the loop and the fused Adam step, alternating round by round."""
    config = load_config(args.recipe, args.overrides)
    vocab = config.tokenizer.vocab_size
    model = build_model(config.model, vocab, tgt_vocab_size=vocab, share_vocab=config.tokenizer.joint)
    parameters = list(model.parameters())
    for parameter in parameters:
        parameter.grad = torch.randn_like(parameter)
    peak = common.matmul_flops_per_s(smoke=args.smoke)
    rounds: dict[str, list[float]] = {"loop": [], "fused": []}
    for _ in range(args.rounds):
        for name in rounds:
            rounds[name].append(round(step_ms(parameters, name == "fused", args.steps), 2))
    return {
        **common.smoke_label(args),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "threads": torch.get_num_threads()},
        "torch": torch.__version__,
        "recipe": str(args.recipe),
        "parameters_m": round(sum(p.numel() for p in parameters) / 1e6, 2),
        "matmul_gflop_per_s": round(peak / 1e9, 1),
        "step_ms_rounds": rounds,
        "step_ms_best": {name: min(values) for name, values in rounds.items()},
    }


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, run_benchmark, args.output)
    best, rounds = report["step_ms_best"], report["step_ms_rounds"]
    print(f"Adam step, {report['parameters_m']}M parameters, {report['machine']['threads']} threads (rounds A B A B ...):")
    for name, values in rounds.items():
        print(f"  {name:<6} {' '.join(f'{v:7.2f}' for v in values)} ms   best {best[name]:.2f} ms")
    print(f"fused / loop: {best['fused'] / best['loop']:.2f}; fp32 matmul peak {report['matmul_gflop_per_s']} GFLOP/s")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
