"""Time of one Adam step for a recipe's model: torch's per-tensor loop against its fused kernel.

    python benchmarks/optimizer.py recipes/multi30k/demo.yaml [--set KEY=VALUE ...] [--rounds 3]
        [--steps 20] [--output benchmarks/results/optimizer.json]

The model is built from the recipe (vocabulary from `tokenizer.vocab_size`), every parameter gets
a random gradient, and the two optimisers alternate A B A B ... for `--rounds` rounds of `--steps`
steps each, so drift shows; the figure of each is its best round. `mtkit train` uses the fused one
where torch has it (CUDA; CPU from torch 2.4). The fp32 matmul peak is measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402 - benchmarks/speed.py, beside this file

from mtkit.config import load_config  # noqa: E402
from mtkit.errors import MtkitError  # noqa: E402
from mtkit.models import build_model  # noqa: E402


def step_ms(parameters: list[torch.nn.Parameter], fused: bool, steps: int) -> float:
    """Milliseconds per Adam step (the recipe trainer's betas and eps), after three warm-up steps."""
    optimizer = torch.optim.Adam(parameters, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=False, fused=fused or None)
    for _ in range(3):
        optimizer.step()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/optimizer.json"))
    args = parser.parse_args()
    try:
        config = load_config(args.recipe, args.overrides)
    except MtkitError as err:
        sys.exit(f"optimizer: error: {err}")
    vocab = config.tokenizer.vocab_size
    model = build_model(config.model, vocab, vocab, config.tokenizer.joint)
    parameters = list(model.parameters())
    for parameter in parameters:
        parameter.grad = torch.randn_like(parameter)
    peak = speed.matmul_flops_per_s()
    rounds: dict[str, list[float]] = {"loop": [], "fused": []}
    for _ in range(args.rounds):
        for name in rounds:
            rounds[name].append(round(step_ms(parameters, name == "fused", args.steps), 2))
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "threads": torch.get_num_threads()},
        "torch": torch.__version__,
        "recipe": str(args.recipe),
        "parameters_m": round(sum(p.numel() for p in parameters) / 1e6, 2),
        "matmul_gflop_per_s": round(peak / 1e9, 1),
        "step_ms_rounds": rounds,
        "step_ms_best": {name: min(values) for name, values in rounds.items()},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    best = report["step_ms_best"]
    print(f"Adam step, {report['parameters_m']}M parameters, {report['machine']['threads']} threads (rounds A B A B ...):")
    for name, values in rounds.items():
        print(f"  {name:<6} {' '.join(f'{v:7.2f}' for v in values)} ms   best {best[name]:.2f} ms")
    print(f"fused / loop: {best['fused'] / best['loop']:.2f}; fp32 matmul peak {report['matmul_gflop_per_s']} GFLOP/s")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
