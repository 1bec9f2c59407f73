"""Check a lent GPU in one call: training speed lever by lever, where a step's time goes, and whether
the fast step learns as the plain fp32 one does. Prints tables and writes one JSON (after each part,
so a call cut short keeps what it measured).

    python -m benchmarks.gpu_check [--parts speed,profile,parity] [--models d256,d512,d1024] [--smoke]
    make gpu-check [SMOKE=1]

Parts:
- speed: for each model (d256 3+3 on Multi30k de-en with the joint 8k vocabulary of
  recipes/multi30k/transformer.yaml at its 3,072-token batches; d512 6+6 and d1024 6+6 on Tatoeba
  en-fr with a joint 32k vocabulary at 16,384-token batches), target tokens/s, MFU against the bf16
  matmul peak measured in the same run, and peak GPU memory, for the step as it was ("plain": eager,
  no look-ahead), the default on CUDA ("default": compiled, look-ahead), and the default with one
  lever changed (d512: eager; no look-ahead; lengths rounded to multiples of 8). Each variant is
  built and warmed up once (compilation happens then, and its seconds are reported), then timed
  windows take turns A B C ... A B C.
- profile: the profiler's split of one update of d512 (`speed.py --profile`), default variant.
- parity: d256 trained from the same start for `--parity-updates` updates, once plain in fp32 and
  once with the default levers in bf16; the validation BLEU of each at the same updates.

The data is prepared first where its folder (data/gpu_check/) lacks it (the Multi30k and Tatoeba
files in ../shared/data). On the CPU, `--smoke` runs every part in seconds on a tiny model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.speed import TimedTraining, print_profile, profile_split
from mtkit.config import Config, load_config

MULTI30K = "../shared/data/multi30k"
TATOEBA = "../shared/data/tatoeba-en-fr"
MULTI30K_DATA = [
    f"data.train={{src: {MULTI30K}/train.de.gz, tgt: {MULTI30K}/train.en.gz}}",
    f"data.valid={{src: {MULTI30K}/val.de.gz, tgt: {MULTI30K}/val.en.gz}}",
    f"data.test={{src: {MULTI30K}/test_2016_flickr.de.gz, tgt: {MULTI30K}/test_2016_flickr.en.gz}}",
    "data_dir=data/gpu_check/multi30k_8k",
]
TATOEBA_DATA = ["tokenizer.vocab_size=32000", "data_dir=data/gpu_check/tatoeba_32k", "train.batch_tokens=16384"]
BIG = ["model.heads=8", "model.ffn_dim=2048", "model.layers=6", "model.dropout=0.1"]
WIDE = ["model.heads=16", "model.ffn_dim=4096"]
# name: (recipe, overrides)
MODELS = {
    "d256": ("recipes/multi30k/transformer.yaml", MULTI30K_DATA),
    "d512": ("recipes/tatoeba/general_en_fr.yaml", [*TATOEBA_DATA, "model.d_model=512", *BIG]),
    "d1024": (
        "recipes/tatoeba/general_en_fr.yaml",
        [*TATOEBA_DATA, *BIG, "model.d_model=1024", "model.heads=16", "model.ffn_dim=4096"],
    ),
}
PLAIN = ["train.compile=false", "train.length_multiple=1", "train.prefetch=false"]
# variant: its overrides on top of the model's (none: the defaults, compile and look-ahead on with CUDA)
VARIANTS = {
    "plain": PLAIN,
    "default": [],  # compiled, look-ahead
    "default, eager": ["train.compile=false"],
    "default, no look-ahead": ["train.prefetch=false"],
    "default + lengths x8": ["train.length_multiple=8"],
}
SHORT_VARIANTS = ("plain", "default")  # for every model but d512


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="speed,profile,parity", help="comma-separated: speed, profile, parity")
    parser.add_argument("--models", default="d512,d256,d1024", help="comma-separated models for speed: d256, d512, d1024")
    parser.add_argument("--variants", help=f"comma-separated variants to time (default: all for d512, else {SHORT_VARIANTS})")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="override KEY=VALUE for every variant")
    parser.add_argument("--profile-variant", default="default", help="the variant the profile part splits (on d512)")
    parser.add_argument("--warmup-updates", type=int, default=20)
    parser.add_argument("--updates", type=int, default=50, help="updates in each timed window")
    parser.add_argument("--rounds", type=int, default=2, help="timed windows of each variant, taking turns")
    parser.add_argument("--profile-updates", type=int, default=10)
    parser.add_argument("--parity-updates", type=int, default=2000)
    parser.add_argument("--parity-every", type=int, default=500, help="validate every this many updates")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/gpu_check.json"))
    common.add_smoke_options(parser)
    return parser.parse_args()


def model_config(args: argparse.Namespace, model: str, variant: list[str]) -> Config:
    recipe, overrides = MODELS[model]
    return load_config(recipe, [*overrides, *args.extra, *variant])


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: every model is the tiny recipe; a few updates each; parity over a few updates."""
    recipe = common.smoke_recipe(work)
    for name in MODELS:
        MODELS[name] = (str(recipe), [])
    # compile stays auto (off on the CPU: it takes minutes there); the other levers on, as on CUDA
    args.extra += ["train.batch_tokens=400", "train.prefetch=true", "train.length_multiple=8"]
    args.warmup_updates, args.updates, args.rounds, args.profile_updates = 1, 2, 2, 2
    args.parity_updates, args.parity_every = 2, 1


def speed_of(args: argparse.Namespace, model: str, peak: float) -> dict:
    """Each variant built and warmed up once, then timed windows in turns; the windows' figures by variant."""
    names = args.variants.split(",") if args.variants else VARIANTS if model == "d512" else SHORT_VARIANTS
    timed, results = {}, {}
    for name in names:
        start = time.perf_counter()
        timed[name] = TimedTraining(model_config(args, model, VARIANTS[name]))
        timed[name].steps(args.warmup_updates)
        common.synchronize(timed[name].device)
        results[name] = {"warmup_s": round(time.perf_counter() - start, 1), "windows": []}
        print(f"{model} {name}: built and warmed up in {results[name]['warmup_s']} s", file=sys.stderr, flush=True)
    for _ in range(args.rounds):
        for name in names:
            results[name]["windows"].append(timed[name].window(args.updates, peak))
    for name in names:
        best = max(results[name]["windows"], key=lambda w: w["target_tokens_per_s"])
        results[name] |= {key: best[key] for key in ("target_tokens_per_s", "mfu", "peak_gpu_mb", "padding_fraction")}
    del timed
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return results


def parity(args: argparse.Namespace) -> dict:
    """Validation BLEU at the same updates: d256 plain in fp32, and with the default levers in bf16 (on CUDA)."""
    from mtkit.training.trainer import train

    curves = {}
    with tempfile.TemporaryDirectory(prefix="mtkit-parity-") as work:
        for name, variant in (("plain fp32", [*PLAIN, "train.precision=fp32"]), ("default", [])):
            schedule = [f"train.max_steps={args.parity_updates}", f"train.validate_every={args.parity_every}"]
            extra = [*schedule, "train.max_time=null", "train.patience=0", "train.snapshots=''", "train.ema=0"]
            config = model_config(args, "d256", [*variant, *extra, f"run_dir={work}/{len(curves)}"])
            start = time.perf_counter()
            train(config)
            records = [json.loads(line) for line in (config.run_path / "log.jsonl").read_text().splitlines()]
            bleu = {r["step"]: r["valid_bleu"] for r in records if "valid_bleu" in r}
            curves[name] = {"valid_bleu": bleu, "seconds": round(time.perf_counter() - start, 1)}
    plain, fast = curves["plain fp32"]["valid_bleu"], curves["default"]["valid_bleu"]
    gaps = [abs(fast[step] - plain[step]) for step in plain if step in fast]
    return {**curves, "largest_gap": round(max(gaps), 2) if gaps else None}


def run_check(args: argparse.Namespace) -> dict:
    parts = args.parts.split(",")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else None
    report = {**common.smoke_label(args), "machine": {**common.machine_facts(), **gpu_facts()}, "parts": parts}
    commands = common.MtkitCommands(in_process=args.smoke)
    used = [*(args.models.split(",") if "speed" in parts else []), *(["d512"] if "profile" in parts else [])]
    used += ["d256"] if "parity" in parts else []
    for model in dict.fromkeys(used) if not args.smoke else ["d256"]:  # in smoke mode every model is the tiny one
        common.ensure_prepared(commands, Path(MODELS[model][0]), MODELS[model][1])
    peak = common.matmul_flops_per_s(device, dtype, smoke=args.smoke)
    report["matmul_tflop_per_s"] = round(peak / 1e12, 1)
    print(f"matmul peak: {peak / 1e12:.1f} TFLOP/s ({dtype or torch.float32})", file=sys.stderr, flush=True)
    if "speed" in parts:
        report["speed"] = {}
        for model in args.models.split(","):
            report["speed"][model] = speed_of(args, model, peak)
            save(args, report)
    if "profile" in parts:
        timed = TimedTraining(model_config(args, "d512", VARIANTS[args.profile_variant]))
        timed.steps(args.warmup_updates)
        report["profile"] = profile_split(timed, args.profile_updates)
        save(args, report)
    if "parity" in parts:
        report["parity"] = parity(args)
    return report


def save(args: argparse.Namespace, report: dict) -> None:
    common.write_json(args.output, report)


def gpu_facts() -> dict:
    if not torch.cuda.is_available():
        return {"gpu": None}
    properties = torch.cuda.get_device_properties(0)
    return {"gpu": properties.name, "gpu_memory_mb": properties.total_memory // 2**20, "cuda": torch.version.cuda}


def print_tables(report: dict) -> None:
    print(f"matmul peak {report['matmul_tflop_per_s']} TFLOP/s; {report['machine']}")
    for model, variants in report.get("speed", {}).items():
        print(f"\n{model}: variant | target tokens/s (each window) | MFU | peak GPU MB | padding | warm-up s")
        for name, row in variants.items():
            windows = " / ".join(f"{w['target_tokens_per_s']:,.0f}" for w in row["windows"])
            gpu = row["peak_gpu_mb"] if row["peak_gpu_mb"] is not None else "-"
            print(
                f"  {name:24} | {windows} | {100 * (row['mfu'] or 0):.1f}% | {gpu} | "
                f"{100 * row['padding_fraction']:.1f}% | {row['warmup_s']}"
            )
    if "profile" in report:
        print()
        print_profile(report["profile"])
    if "parity" in report:
        for name in ("plain fp32", "default"):
            curve = report["parity"][name]
            print(f"parity {name:10}: valid BLEU {curve['valid_bleu']} ({curve['seconds']} s)")
        print(f"parity: largest BLEU gap at the same update {report['parity']['largest_gap']}")


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, run_check, args.output)
    print_tables(report)
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
