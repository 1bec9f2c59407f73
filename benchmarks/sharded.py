"""Peak resident memory per process of one fine-tuning update: one process holding the whole model against
`train.shard: fsdp` over 2 processes (torchrun; gloo on the CPU), at random NLLB shapes.

    python -m benchmarks.sharded [--shapes 600M,1.3B,3.3B] [--memory-gb 24] [--batch-pairs 8] [--length 24]
        [--threads 0] [--out benchmarks/results/sharded.json] [--smoke]

Each process builds mtkit's Transformer at the shape (random weights, tied embeddings, NLLB's 256,206 rows) as
`mtkit train` does (`setup_process`, `training_forward`, `build_optimizer`), runs one update (forward, backward,
Adam) to warm up, then one timed update, and reports its peak RSS. Both systems learn from the same random
pairs (`--batch-pairs` of `--length` tokens a side): the one process from all of them, each FSDP process from its
half, as torchrun's ranks share a batch. A shape whose estimated need on this machine (16 bytes a parameter for
the weights, gradient and Adam's two moments; with FSDP, each process's half of them plus the largest layer,
gathered whole with its gradient while it computes: the vocabulary's tables stay sharded) is over `--memory-gb`
is skipped, and said. Every run is a process (or a torchrun job) of its own, one after another. Prints the figures and writes
JSON. `--smoke`: a tiny shape, in seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import common, turns
from benchmarks.turns import peak_rss_mb, timed
from mtkit.config import TrainConfig
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from mtkit.distributed import shutdown
from mtkit.models.transformer import Transformer
from mtkit.runtime import set_threads
from mtkit.training.levers import Levers
from mtkit.training.trainer import build_optimizer, setup_process, training_forward

VOCAB = 256_206  # NLLB-200's rows
# NLLB-200's shapes (distilled 600M and 1.3B, and 3.3B): model width, layers a side, heads, feed-forward width
SHAPES = {
    "600M": {"d_model": 1024, "layers": 12, "heads": 16, "ffn_dim": 4096, "vocab": VOCAB},
    "1.3B": {"d_model": 1024, "layers": 24, "heads": 16, "ffn_dim": 8192, "vocab": VOCAB},
    "3.3B": {"d_model": 2048, "layers": 24, "heads": 32, "ffn_dim": 8192, "vocab": VOCAB},
}
SMOKE_SHAPES = {"tiny": {"d_model": 16, "layers": 1, "heads": 2, "ffn_dim": 32, "vocab": 300}}
SYSTEMS = {"whole, 1 process": 1, "fsdp, 2 processes": 2}
BYTES_A_PARAMETER = 16  # fp32 weight, gradient and Adam's two moments


def build(shape: dict) -> Transformer:
    """mtkit's Transformer at `shape`, with NLLB's fixed settings (pre-norm, ReLU, scaled embeddings)."""
    sizes = {key: shape[key] for key in ("layers", "d_model", "heads", "ffn_dim")}
    return Transformer(shape["vocab"], shape["vocab"], **sizes, dropout=0.1, max_positions=1024, activation="relu")


def estimated_gb(shape: dict, processes: int) -> float:
    """What one update needs on this machine, all processes together (`processes` 2: sharded), in GB; activations
    and the allocator's slack not counted. Counted on the meta device, which costs nothing."""
    with torch.device("meta"):
        model = build(shape)
    total = model.num_parameters()
    largest = max(sum(p.numel() for p in block.parameters()) for block in model.repeated_blocks())
    need = BYTES_A_PARAMETER * total if processes == 1 else BYTES_A_PARAMETER * total + processes * 8 * largest
    return round(need / 1e9, 1)


def random_pairs(task: dict, rank: int, processes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This process's share of the random pairs (the same for every system): src, tgt_in, tgt_out (B, length)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(EOS_ID + 1, task["shape"]["vocab"], (task["pairs"], 2, task["length"]), generator=generator)
    ids = ids[rank::processes]
    src, tgt = ids[:, 0], ids[:, 1]
    src[:, -1] = EOS_ID
    tgt_in = torch.cat([torch.full_like(tgt[:, :1], BOS_ID), tgt[:, :-1]], dim=1)
    return src, tgt_in, tgt


def child(task: dict) -> dict:
    """One system's update in this process (a rank of a torchrun job with FSDP): built as `mtkit train` builds it,
    warmed up, timed once; its seconds and peak RSS. A rank of a job also writes its answer to a file of its own."""
    shard = "fsdp" if task["processes"] > 1 else "none"
    settings = TrainConfig(lr=1e-5, device="cpu", threads=task["threads"], shard=shard, label_smoothing=0.1)
    distributed, device = setup_process(settings)
    model = build(task["shape"]).train()
    forward = training_forward(model, settings, distributed=distributed, device=device, levers=Levers.of(settings, device))
    optimizer, _ = build_optimizer(model, settings, device=device)
    src, tgt_in, tgt_out = random_pairs(task, distributed.rank, distributed.world_size)

    def update() -> None:
        forward(src, src.ne(PAD_ID), tgt_in, tgt_out).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    update()
    answer = {"seconds": round(timed(update), 3), "peak_rss_mb": peak_rss_mb(), "rank": distributed.rank}
    if distributed.enabled:
        common.write_json(Path(task["answers"]) / f"rank{distributed.rank}.json", answer)
    shutdown(distributed)
    return answer


def run_system(task: dict, *, in_process: bool) -> list[dict]:
    """One system's update as a process of its own (in this one: `in_process`), or as a torchrun job of
    `processes`; each process's answer."""
    if task["processes"] == 1:
        return [child(task) if in_process else turns.in_own_process("benchmarks.sharded", task)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(task["processes"])]
    subprocess.run([*torchrun, "-m", "benchmarks.sharded", "--child", json.dumps(task)], check=True, cwd=common.ROOT)
    return [json.loads((Path(task["answers"]) / f"rank{rank}.json").read_text()) for rank in range(task["processes"])]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="600M,1.3B,3.3B", help=f"NLLB shapes among {', '.join(SHAPES)}")
    parser.add_argument("--memory-gb", type=float, default=24.0, help="skip a run estimated to need more than this")
    parser.add_argument("--batch-pairs", type=int, default=8, help="random sentence pairs in the update's batch")
    parser.add_argument("--length", type=int, default=24, help="tokens a side of each pair")
    parser.add_argument("--threads", type=int, default=0, help="torch threads of each process (0: all cores)")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/sharded.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one system's update, started by run_benchmark
    common.add_smoke_options(parser)
    args = parser.parse_args()
    args.shape_table, args.in_process = SHAPES, False
    return args


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: a tiny shape, the one process's update run in this process (FSDP's is a torchrun job still)."""
    args.shape_table, args.shapes, args.in_process = SMOKE_SHAPES, "tiny", True
    args.batch_pairs, args.length, args.threads = 4, 6, 1


def run_benchmark(args: argparse.Namespace) -> dict:
    """Each shape's update by each system, or why it was skipped; prints each shape's table."""
    result = {**common.smoke_label(args), "date": datetime.date.today().isoformat()}
    result |= {"machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    result |= {"memory_gb": args.memory_gb, "batch_pairs": args.batch_pairs, "length": args.length, "shapes": {}}
    for name in args.shapes.split(","):
        shape = args.shape_table[name]
        result["shapes"][name] = figures = {"shape": shape}
        print(f"{name}: d_model {shape['d_model']}, {shape['layers']}+{shape['layers']} layers, {shape['vocab']} rows")
        for system, processes in SYSTEMS.items():
            figures[system] = measure(args, shape, processes)
            print_row(system, figures[system])
        whole, sharded = (figures[system].get("peak_rss_mb") for system in SYSTEMS)
        if whole and sharded:
            figures["fsdp_over_whole"] = round(max(sharded) / whole[0], 3)
            print(f"  fsdp's largest process / the whole model's: {figures['fsdp_over_whole']:.2f}")
    return result


def measure(args: argparse.Namespace, shape: dict, processes: int) -> dict:
    """One system's figures at `shape`: its processes' seconds and peak RSS, or the estimate that skipped it."""
    need = estimated_gb(shape, processes)
    if need > args.memory_gb:
        return {"skipped": f"needs about {need} GB, over --memory-gb {args.memory_gb}", "estimated_gb": need}
    with tempfile.TemporaryDirectory() as answers:
        task = {"shape": shape, "processes": processes, "pairs": args.batch_pairs, "length": args.length}
        task |= {"threads": args.threads, "answers": answers}
        found = run_system(task, in_process=args.in_process)
    found.sort(key=lambda answer: answer["rank"])
    return {
        "estimated_gb": need,
        "seconds": [answer["seconds"] for answer in found],
        "peak_rss_mb": [answer["peak_rss_mb"] for answer in found],
    }


def print_row(system: str, row: dict) -> None:
    if "skipped" in row:
        print(f"  {system:<18} skipped: {row['skipped']}")
        return
    peaks = ", ".join(f"{peak:.0f}" for peak in row["peak_rss_mb"])
    print(f"  {system:<18} peak RSS {peaks} MB per process, update {max(row['seconds']):.2f} s")


def main() -> None:
    args = parse_args()
    if args.child:
        task = json.loads(args.child)
        set_threads(task["threads"])
        answer = child(task)
        if task["processes"] == 1:  # the ranks of a torchrun job answer in files
            print(json.dumps({"result": answer}))
        return
    common.measure_and_write(args, tiny_arguments, run_benchmark, args.out)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
