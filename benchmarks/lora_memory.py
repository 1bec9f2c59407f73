"""The peak memory and time of one fine-tuning update at NLLB-200's shapes: every weight trained, mtkit's LoRA, and
transformers with peft's LoRA, on the same batch.

    python -m benchmarks.lora_memory [--shapes 600M,1.3B,3.3B] [--batch-pairs 8] [--length 32] [--rank 8]
        [--threads 0] [--out benchmarks/results/lora_memory.json] [--smoke]

Random weights of NLLB-200's shapes (600M: d_model 1024, 12+12 layers, FFN 4096; 1.3B: 24+24 layers, FFN 8192;
3.3B: d_model 2048, 24+24 layers, FFN 8192; 16 heads, a tied vocabulary of 256,206 rows, fairseq's sinusoids, ReLU),
no files: mtkit's Transformer built as `mtkit import` builds an NLLB model, and transformers'
M2M100ForConditionalGeneration of the same config. Each system runs in a process of its own: the model built, one
batch of `--batch-pairs` random pairs of `--length` tokens a side (the same ids for all), one update to warm up
(forward, label-smoothed summed loss, backward, Adam), one timed; it reports the update's seconds and the process's
peak resident memory (VmHWM) with its baseline once the model is built. The systems: "mtkit full" (every weight,
set up as `mtkit train --init-from` sets it up: its step module and fused Adam), "mtkit lora" (the same with
`train.lora`: rank `--rank`, alpha 2 x rank, the attention projections qkv, query, key_value and out; Adam over
the adapters alone) and "transformers peft" (peft's LoraConfig on q_proj, k_proj, v_proj and out_proj at the same
rank and alpha; torch.optim.Adam over its trainable parameters). A shape whose fp32 weights, gradients and Adam
moments (16 bytes a parameter, and about 6 more for the update's activations and copies) exceed the memory
available skips its full update, and one whose weights (4 bytes a parameter, plus a quarter) exceed it skips all
three, saying so. Prints the figures with the ratios and writes
JSON. Needs `transformers` and `peft` (pip install -e '.[dev]'); offline. `--smoke`: a tiny model of the same
layout (d_model 16, one layer a side, 400 rows), every run in this process, in seconds.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import platform
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from benchmarks import common, turns
from benchmarks.import_memory import resident_mb
from mtkit.config import LoraConfig, ModelConfig, TrainConfig
from mtkit.data.tokenizer import PAD_ID
from mtkit.importers.m2m100 import M2M100
from mtkit.models import build_model
from mtkit.models.lora import apply_lora
from mtkit.runtime import set_threads
from mtkit.training.levers import Levers
from mtkit.training.trainer import build_optimizer, setup_process, training_forward

SYSTEMS = ["mtkit full", "mtkit lora", "transformers peft"]
VOCAB = 256206  # NLLB-200's config.json vocab_size
SHAPES = {  # NLLB-200's config.json of each size: d_model, layers a side, heads, FFN
    "600M": {"d_model": 1024, "layers": 12, "heads": 16, "ffn": 4096, "vocab": VOCAB},
    "1.3B": {"d_model": 1024, "layers": 24, "heads": 16, "ffn": 8192, "vocab": VOCAB},
    "3.3B": {"d_model": 2048, "layers": 24, "heads": 16, "ffn": 8192, "vocab": VOCAB},
}
SMOKE_SHAPES = {"tiny": {"d_model": 16, "layers": 1, "heads": 2, "ffn": 32, "vocab": 400}}
TARGETS = {"mtkit": ["qkv", "query", "key_value", "out"], "peft": ["q_proj", "k_proj", "v_proj", "out_proj"]}
# a parameter's bytes: fp32 weight, gradient and two moments, and the update's activations and copies besides (the
# 600M shape's full update peaked at 1.4 times the 16); a weight and some
FULL_BYTES, WEIGHT_BYTES = 22, 5


def model_config(shape: dict) -> ModelConfig:
    """mtkit's `model` section of an NLLB model of `shape`, as `mtkit import` writes it."""
    sizes = {"d_model": shape["d_model"], "layers": shape["layers"], "heads": shape["heads"], "ffn_dim": shape["ffn"]}
    return ModelConfig(**M2M100.model_keys, **sizes, activation="relu", dropout=0.1, attention_dropout=0.1)


def parameters(shape: dict) -> int:
    """The parameters of the model of `shape` (built on the meta device: nothing allocated)."""
    with torch.device("meta"):
        model = build_model(model_config(shape), shape["vocab"], tgt_vocab_size=shape["vocab"], share_vocab=True)
    return model.num_parameters()


def bare_products(task: dict) -> dict:
    """The matrix products of one LoRA update of `task`'s shape and batch, each timed bare at its shape (fp32, the best
    of 4): the forward's and the activations' gradients' (the frozen weights get none), their seconds and GFLOP."""
    shape, tokens = task["shape"], task["batch_pairs"] * task["length"]
    d, ffn = shape["d_model"], shape["ffn"]
    layer = [(d, 3 * d), (d, d), (d, ffn), (ffn, d)]  # an encoder layer's; a decoder layer adds cross-attention's
    shapes = layer * shape["layers"] + (layer + [(d, d), (d, 2 * d), (d, d)]) * shape["layers"] + [(d, shape["vocab"])]
    timed = {}
    for rows, columns in set(shapes):
        x, weight, grad = torch.randn(tokens, rows), torch.randn(rows, columns), torch.randn(tokens, columns)
        products = (partial(torch.matmul, x, weight), partial(torch.matmul, grad, weight.t()))
        timed[rows, columns] = sum(min(turns.timed(product) for _ in range(4)) for product in products)  # a warm-up
    flops = sum(4 * tokens * rows * columns for rows, columns in shapes)
    return {"seconds": round(sum(timed[s] for s in shapes), 3), "gflop": round(flops / 1e9, 1)}


def batch(task: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The same random pairs for every system: source ids and target ids (B, L), no padding, no special id."""
    generator = torch.Generator().manual_seed(0)
    size = (task["batch_pairs"], task["length"])
    return tuple(torch.randint(4, task["shape"]["vocab"], size, generator=generator) for _ in range(2))


def mtkit_update(task: dict, *, lora: bool) -> Callable[[], object]:
    """One update of mtkit's model set up as `mtkit train` sets it up (with `train.lora` when `lora`)."""
    adapters = LoraConfig(rank=task["rank"], alpha=2.0 * task["rank"], targets=TARGETS["mtkit"]) if lora else None
    settings = TrainConfig(lr=1e-5, device="cpu", threads=task["threads"], lora=adapters)
    distributed, device = setup_process(settings)
    shape = task["shape"]
    model = build_model(model_config(shape), shape["vocab"], tgt_vocab_size=shape["vocab"], share_vocab=True).train()
    if adapters is not None:
        apply_lora(model, adapters)
    forward = training_forward(model, settings, distributed=distributed, device=device, levers=Levers.of(settings, device))
    optimizer, _ = build_optimizer(model, settings, device=device)
    src, tgt = batch(task)
    tgt_in = torch.cat([torch.full((tgt.size(0), 1), 2), tgt[:, :-1]], dim=1)  # BOS, then the target

    def update() -> None:
        forward(src, src.ne(PAD_ID), tgt_in, tgt).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update


def peft_update(task: dict) -> Callable[[], object]:
    """One update of transformers' M2M100ForConditionalGeneration of the shape with peft's LoRA (label-smoothed
    summed loss, Adam over the adapters)."""
    from peft import LoraConfig as PeftConfig
    from peft import get_peft_model
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    set_threads(task["threads"])
    shape = task["shape"]
    config = M2M100Config(vocab_size=shape["vocab"], **common.transformers_shape(shape), encoder_layerdrop=0.0,
                          decoder_layerdrop=0.0, scale_embedding=True, activation_function="relu")  # fmt: skip
    torch.manual_seed(0)
    adapters = PeftConfig(r=task["rank"], lora_alpha=2 * task["rank"], lora_dropout=0.0, target_modules=TARGETS["peft"])
    model = get_peft_model(M2M100ForConditionalGeneration(config), adapters).train()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    src, tgt = batch(task)
    decoder_input = torch.cat([torch.full((tgt.size(0), 1), config.decoder_start_token_id), tgt[:, :-1]], dim=1)

    def update() -> None:
        logits = model(input_ids=src, decoder_input_ids=decoder_input).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), label_smoothing=0.1, reduction="sum")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update


def child(task: dict) -> dict:
    """One system's update, meant for a process of its own: built, warmed up once, timed once; its seconds, the
    process's resident memory once built and its peak (MB)."""
    system = task["system"]
    update = peft_update(task) if system == "transformers peft" else mtkit_update(task, lora=system == "mtkit lora")
    built = resident_mb("VmRSS")
    update()
    start = time.perf_counter()
    update()
    return {"seconds": round(time.perf_counter() - start, 3), "built_mb": built, "peak_mb": resident_mb("VmHWM")}


def available_mb() -> float:
    """The memory available to a new process now (MemAvailable), in MB."""
    for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")  # not Linux: nothing skipped


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="600M,1.3B,3.3B", help=f"NLLB-200 sizes, separated by commas: {', '.join(SHAPES)}")
    parser.add_argument("--batch-pairs", type=int, default=8, help="sentence pairs in the batch")
    parser.add_argument("--length", type=int, default=32, help="tokens a side of each pair")
    parser.add_argument("--rank", type=int, default=8, help="LoRA's rank (alpha: twice it), for mtkit and peft")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/lora_memory.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one system's update, started by run_benchmark
    common.add_smoke_options(parser)
    parser.set_defaults(run_child=lambda task: turns.in_own_process("benchmarks.lora_memory", task), shape_table=SHAPES)
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: a tiny model, every run in this process."""
    args.shapes, args.shape_table, args.run_child = "tiny", SMOKE_SHAPES, child
    args.batch_pairs, args.length, args.rank, args.threads = 2, 6, 2, 1


def run_benchmark(args: argparse.Namespace) -> dict:
    """Each shape's three updates, one process each, with the ratios; prints them."""
    result = {**common.smoke_label(args), "date": datetime.date.today().isoformat()}
    result |= {"machine": platform.processor() or platform.machine(), **common.machine_facts()}
    result |= {"versions": {name: importlib.metadata.version(name) for name in ("torch", "transformers", "peft")}}
    result |= {"batch_pairs": args.batch_pairs, "length": args.length, "rank": args.rank, "shapes": {}}
    for name in args.shapes.split(","):
        shape = args.shape_table[name.strip()]
        task = {"shape": shape, "batch_pairs": args.batch_pairs, "length": args.length, "rank": args.rank}
        task["threads"] = args.threads
        result["shapes"][name] = measure_shape(task, args.run_child)
        report_shape(name, result["shapes"][name])
    return result


def measure_shape(task: dict, run: Callable[[dict], dict]) -> dict:
    """One shape's parameters and each system's update (or why it was skipped), with LoRA against the others."""
    count, free = parameters(task["shape"]), available_mb()
    figures: dict = {"parameters_m": round(count / 1e6, 1), "available_mb": round(free)}
    for system in SYSTEMS:
        needed = count * (FULL_BYTES if system == "mtkit full" else WEIGHT_BYTES) / 2**20
        if needed > free:
            figures[system] = {"skipped": f"needs about {needed / 1024:.1f} GB, {free / 1024:.1f} GB available"}
            continue
        figures[system] = run({**task, "system": system})
    full, lora, peft = (figures[system] for system in ("mtkit full", "mtkit lora", "transformers peft"))
    if "peak_mb" in lora and "peak_mb" in full:
        figures["lora_peak_over_full"] = round(lora["peak_mb"] / full["peak_mb"], 3)
    if "seconds" in lora and "seconds" in peft:
        figures["lora_speed_over_peft"] = round(peft["seconds"] / lora["seconds"], 2)
    figures["bare_products"] = bare_products(task)  # what an update cannot do without, for its time
    return figures


def report_shape(name: str, figures: dict) -> None:
    print(f"NLLB-200 {name} shape, {figures['parameters_m']}M parameters ({figures['available_mb']} MB available):")
    for system in SYSTEMS:
        row = figures[system]
        if "skipped" in row:
            print(f"  {system:<20} skipped: {row['skipped']}")
            continue
        print(f"  {system:<20} update {row['seconds']:8.3f} s, peak RSS {row['peak_mb']:8.0f} MB ({row['built_mb']:.0f} built)")
    bare = figures["bare_products"]
    print(f"  the update's matrix products alone: {bare['seconds']:.3f} s ({bare['gflop']} GFLOP)")
    if "lora_peak_over_full" in figures:
        print(f"  mtkit lora's peak / mtkit full's: {figures['lora_peak_over_full']:.3f}")
    if "lora_speed_over_peft" in figures:
        print(f"  mtkit lora's update speed / transformers peft's: {figures['lora_speed_over_peft']:.2f}x")


def main() -> None:
    args = parse_args()
    if args.child:
        turns.answer_child(child, args.child)
        return
    common.measure_and_write(args, tiny_arguments, run_benchmark, args.out)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
