"""Check a lent GPU in one call that keeps a time budget: training speed lever by lever, compiling from a cold
and a warm cache, where a step's time goes, and whether the fast step learns as the plain fp32 one does.

    python -m benchmarks.gpu_check --prepare-only [--data DIR]     here, where ../shared/data is
    python -m benchmarks.gpu_check --budget SECONDS [--data DIR] [--parts levers,compile,...]   on the GPU
    make gpu-check [SMOKE=1]

Parts, in their order of priority (each item only where the budget still has room for it: a line on stderr and
a row under "budget" in the JSON say what was skipped):
- levers (a): d512 6+6 on Tatoeba en-fr with a joint BPE of about 32k pieces, consecutive pairs joined to about
  30 pieces a side (WMT-length batches), 16,384-token batches, eager: every lever of benchmarks/gpu/levers.py off
  ("plain"), all on, and all on but each one; each variant built and warmed up once, then timed windows in turns.
- compile (b): the fastest of (a) compiled in each of --compile-modes' ways, in their order: layer by layer
  (train.compile=layers), layer by layer replayed as CUDA graphs (train.cuda_graphs, over 16 shapes), whole replayed
  as CUDA graphs, whole; each from an empty compiler cache, and the first way again in a fresh process from the
  cache artifacts its cold run saved; the warm-up seconds of each are the compile's cost.
- d1024 (c): d1024 6+6 (Transformer-big's shape) on the same batches, plain against the fastest of (a), eager in
  turns, then compiled in the fastest way of (b) from an empty cache.
- profile (d): the profiler's split of an update of the fastest of (a) (`speed.py --profile`), and of (b)'s first
  way, from the warm cache, after its windows.
- tatoeba (e): d512 on Tatoeba's own short pairs, plain against the fastest of (a).
- parity (f): d256 on Multi30k de-en (8k BPE) for --parity-updates updates, plain in fp32 and as the default
  step; the validation BLEU of each at the same updates.

Every figure comes with MFU against the bf16 matmul peak measured in the same run. The JSON is written after
every variant and window, so a call killed at its timeout keeps what was measured. The data is prepared here
(--prepare-only: token ids and tokenizers, no weights, about 31 MB) and carried: the GPU machine downloads
nothing; the WMT-length set is made from the carried Tatoeba ids where the check runs (under a minute).
`--smoke` runs every part on the CPU in seconds on a tiny model (a third round of windows forced over the budget).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.gpu import data
from benchmarks.gpu.budget import Budget, parse_estimates
from benchmarks.gpu.levers import COMPILE_MODES
from benchmarks.gpu.parts import LEVER_LABEL, PARTS
from benchmarks.gpu.runs import Check
from benchmarks.speed import print_profile

BIG = ["model.heads=8", "model.ffn_dim=2048", "model.layers=6", "model.dropout=0.1", "train.batch_tokens=16384"]
SHAPES = {
    "d256": [],  # recipes/multi30k/transformer.yaml's own: 3+3, 3,072-token batches
    "d512": [*BIG, "model.d_model=512"],
    "d1024": [*BIG, "model.d_model=1024", "model.heads=16", "model.ffn_dim=4096"],
}
# label: (model, data set)
LABELS = {
    LEVER_LABEL: ("d512", "tatoeba_wmt"),
    "d1024 wmt": ("d1024", "tatoeba_wmt"),
    "d512 tatoeba": ("d512", "tatoeba"),
    "d256 multi30k": ("d256", "multi30k_8k"),
}
ALIASES = {"speed": ["levers", "d1024", "tatoeba"]}  # the older part name


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from: {', '.join(PARTS)}")
    parser.add_argument("--budget", type=float, help="seconds the whole check may take (set it below the call's timeout)")
    parser.add_argument("--estimate", action="append", default=[], help="ITEM=SECONDS: the estimate of one item")
    parser.add_argument("--data", type=Path, default=Path("benchmarks/results/gpu_data"), help="the prepared data")
    parser.add_argument("--prepare-only", action="store_true", help="prepare the data in --data and stop")
    modes = ",".join(COMPILE_MODES)
    parser.add_argument("--compile-modes", default=modes, help=f"part (b)'s ways to compile, comma-separated, from: {modes}")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="override KEY=VALUE for every variant")
    parser.add_argument("--warmup-updates", type=int, default=20)
    parser.add_argument("--updates", type=int, default=50, help="updates in each timed window")
    parser.add_argument("--rounds", type=int, default=2, help="timed windows of each variant, taking turns")
    parser.add_argument("--profile-updates", type=int, default=10)
    parser.add_argument("--parity-updates", type=int, default=2000)
    parser.add_argument("--parity-every", type=int, default=500, help="validate every this many updates")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/gpu_check.json"))
    common.add_smoke_options(parser)
    args = parser.parse_args()
    args.parts = [part for name in args.parts.split(",") for part in ALIASES.get(name, [name])]
    if unknown := [part for part in args.parts if part not in PARTS]:
        parser.error(f"--parts: unknown {', '.join(unknown)}; give some of {', '.join(PARTS)}")
    modes = [mode.strip() for mode in args.compile_modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in COMPILE_MODES]
    if unknown or not modes:
        parser.error(f"--compile-modes: {', '.join(unknown) or 'none given'}; give some of: {', '.join(COMPILE_MODES)}")
    try:
        args.estimates = parse_estimates(args.estimate)
    except ValueError as err:
        parser.error(str(err))
    args.compile, args.sets, args.recipe = {mode: COMPILE_MODES[mode] for mode in modes}, data.SETS, None
    return args


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: every model is the tiny recipe on tiny sets; a few updates; a third round that cannot fit."""
    args.recipe = common.smoke_recipe(work)
    args.sets, args.data = data.smoke_sets(args.recipe), work / "gpu_data"
    # compile stays auto (off on the CPU: it takes minutes there); the other levers on, as on CUDA
    args.extra += ["train.batch_tokens=400", "train.prefetch=true"]
    args.compile = {mode: ["train.compile=auto"] for mode in args.compile}
    args.warmup_updates, args.updates, args.rounds, args.profile_updates = 1, 2, 3, 2
    args.parity_updates, args.parity_every = 2, 1
    args.budget = args.budget or 3600
    args.estimates.setdefault(f"{LEVER_LABEL}: round 3", 1e9)  # the budget's skip, exercised


def model_table(args: argparse.Namespace) -> dict[str, tuple[str, str, list[str]]]:
    """label -> (model, recipe, overrides): the set's recipe with the model's shape (the tiny recipe in smoke mode)."""
    table = {}
    for label, (model, name) in LABELS.items():
        shape = [] if args.smoke else SHAPES[model]
        table[label] = (model, args.recipe or args.sets[name].recipe, [*data.set_overrides(args.sets, args.data, name), *shape])
    return table


def run_check(args: argparse.Namespace) -> dict:
    budget = Budget(args.budget, args.estimates)  # from here: making the joined set counts
    commands = common.MtkitCommands(in_process=args.smoke)
    manifest = data.prepare(args.data, args.sets, commands, carried_only=args.prepare_only)
    if args.prepare_only:
        return {**common.smoke_label(args), **manifest}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report = {**common.smoke_label(args), "machine": {**common.machine_facts(), **gpu_facts()}, "parts": args.parts}
    report["data"] = manifest
    check = Check(args, budget, report, lambda report: common.write_json(args.output, report))
    check.models = model_table(args)
    dtype = torch.bfloat16 if device.type == "cuda" else None
    check.peak = common.matmul_flops_per_s(device, dtype, smoke=args.smoke)
    report["matmul_tflop_per_s"] = round(check.peak / 1e12, 1)
    print(f"matmul peak: {check.peak / 1e12:.1f} TFLOP/s ({dtype or torch.float32})", file=sys.stderr, flush=True)
    for part in PARTS:
        if part in args.parts:
            PARTS[part](check)
            check.save()
    return report


def gpu_facts() -> dict:
    if not torch.cuda.is_available():
        return {"gpu": None}
    properties = torch.cuda.get_device_properties(0)
    return {"gpu": properties.name, "gpu_memory_mb": properties.total_memory // 2**20, "cuda": torch.version.cuda}


def print_tables(report: dict) -> None:
    if "sets" in report:  # --prepare-only
        print(f"prepared: {json.dumps(report['sets'])}; {report['size_mb']} MB in all")
        return
    print(f"data: {json.dumps(report['data'])}")
    print(f"matmul peak {report['matmul_tflop_per_s']} TFLOP/s; {report['machine']}")
    for note in report.get("levers", {}).get("left_out", []):
        print(note)
    for label, variants in report.get("speed", {}).items():
        print(f"\n{label}: variant | target tokens/s (each window) | MFU | peak GPU MB | padding | warm-up s")
        for name, row in variants.items():
            if "failed" in row:
                print(f"  {name:34} | failed: {row['failed'][:200]}")
                continue
            windows = " / ".join(f"{w['target_tokens_per_s']:,.0f}" for w in row["windows"]) or "not timed"
            gpu = row.get("peak_gpu_mb") if row.get("peak_gpu_mb") is not None else "-"
            mfu, padding = 100 * (row.get("mfu") or 0), 100 * row.get("padding_fraction", 0)
            print(f"  {name:34} | {windows} | {mfu:.1f}% | {gpu} | {padding:.1f}% | {row['warmup_s']}")
    for compiled in [*report.get("compile", {}).values(), *report.get("big_compiled", {}).values()]:
        for stage in ("cold", "warm"):
            if stage in compiled:
                print_compiled(compiled["variant"], stage, compiled[stage])
    if "profile" in report:
        print_profile(report["profile"])
    for name, curve in report.get("parity", {}).items():
        if isinstance(curve, dict):
            print(f"parity {name:10}: valid BLEU {curve['valid_bleu']} ({curve['seconds']} s)")
    if "largest_gap" in report.get("parity", {}):
        print(f"parity: largest BLEU gap at the same update {report['parity']['largest_gap']}")
    for skipped in report["budget"]["skipped"]:
        print(f"skipped (budget): {skipped['item']}: about {skipped['estimate_s']} s needed, {skipped['left_s']} s left")


def print_compiled(variant: str, stage: str, row: dict) -> None:
    """One compiled run: its warm-up (the compile) seconds, its windows, the cache artifacts loaded or saved."""
    if "windows" not in row:  # cut at the budget's end, or failed
        print(f"{variant}, {stage} cache: {row}")
        return
    windows = " / ".join(f"{w['target_tokens_per_s']:,.0f}" for w in row["windows"])
    mfu = max((w["mfu"] or 0 for w in row["windows"]), default=0)
    artifacts = {key: row[key] for key in ("artifacts_loaded", "artifacts_saved", "artifacts_mb") if row.get(key)}
    print(f"{variant}, {stage} cache: warm-up {row['warmup_s']} s; target tokens/s {windows}; MFU {100 * mfu:.1f}% {artifacts}")
    if "profile" in row:
        print_profile(row["profile"])


def main() -> None:
    args = parse_args()
    output = args.data / data.MANIFEST if args.prepare_only and not args.smoke else args.output
    report = common.measure_and_write(args, tiny_arguments, run_check, output)
    print_tables(report)
    print(f"written to {output}")


if __name__ == "__main__":
    main()
