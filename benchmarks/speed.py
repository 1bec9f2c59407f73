"""Speed and memory benchmark for a recipe: training throughput and decoding speed, printed and as JSON.

    python -m benchmarks.speed recipes/multi30k/transformer.yaml [--set KEY=VALUE ...] [--model RUN_DIR]
        [--engines pytorch,ctranslate2,ctranslate2-int8] [--compare-compile] [--smoke]

Training: target tokens/s over a steady window of updates (by default updates 51-250, as in the
peer measurements of issue 4; the first updates are warm-up), padding fraction of the batches,
peak RSS (and peak GPU memory on CUDA), and model FLOPs utilisation (MFU): model FLOPs per target
token x tokens/s / the matrix-multiply FLOP/s measured by this script on this machine in the same
run (fp32 on CPU; on CUDA in the training's autocast dtype, bf16 or fp16, on 8192 x 8192 matrices). Decoding:
sentences/s and target pieces/s at beam 5 and greedy on the recipe's test split (model loading
excluded), with BLEU, using a trained run (default: the recipe's run_dir). Run it on an otherwise
idle machine; compare figures as ratios taken in one run. `--smoke` (no recipe needed) times a few
updates of a tiny model and decodes with it on both engines.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import common
from mtkit.config import Config, load_config
from mtkit.data.corpora import iter_split
from mtkit.decoding.translator import Decoding, Translator
from mtkit.evaluation.metrics import score_corpus
from mtkit.training.trainer import Trainer, setup_process


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def training_flops_per_target_token(
    config: Config, vocab_size: int, src_per_tgt: float, src_len: float, tgt_len: float
) -> float | None:
    """Model FLOPs of one training target token (forward + backward = 3 x forward, 2 FLOPs a MAC).

    Transformer: per layer 4d^2 + 2d.ffn MACs per source token (encoder) and 6d^2 + 2d.ffn per
    target token (decoder), cross-attention keys/values 2d^2 per source token, attention scores and
    sums 2.L.d per query, and the output layer d.V per target token. None for other architectures.
    """
    model = config.model
    if model.arch != "transformer":
        return None
    d, ffn = model.d_model, model.ffn_dim
    encoder_layers, decoder_layers = model.encoder_layers or model.layers, model.decoder_layers or model.layers
    encoder_token = encoder_layers * (4 * d * d + 2 * d * ffn + 2 * src_len * d)
    decoder_token = decoder_layers * (6 * d * d + 2 * d * ffn + 2 * (tgt_len / 2) * d + 2 * src_len * d) + d * vocab_size
    cross_keys_values = decoder_layers * 2 * d * d  # per source token
    macs = decoder_token + src_per_tgt * (encoder_token + cross_keys_values)
    return 3 * 2 * macs


def benchmark_training(config: Config, warmup_updates: int, measured_updates: int, *, smoke: bool = False) -> dict:
    """Time `measured_updates` optimiser updates after `warmup_updates`, with the real training step.

    The trainer is set up as `mtkit train` sets it up, without a run directory: nothing is written.
    `smoke`: the matmul peak of a small matrix (a figure that means nothing).
    """
    dist, device = setup_process(config.train)
    trainer = Trainer(config, device, dist)
    epoch = trainer.epoch()
    batches = epoch.batches
    needed = warmup_updates + measured_updates
    batches = (batches * (needed // len(batches) + 1))[:needed]
    real = padded = source_tokens = 0
    sentences = 0
    for index, indices in enumerate(batches):
        if index == warmup_updates:
            common.synchronize(device)
            start = time.perf_counter()
            tokens = 0
        batch = epoch.ids.collate(indices)
        _, batch_tokens = trainer.update([batch])
        if index >= warmup_updates:
            tokens += batch_tokens
            real += batch_tokens
            padded += batch.tgt_out.numel()
            source_tokens += int(batch.src_mask.sum())
            sentences += batch.src.size(0)
    common.synchronize(device)
    seconds = time.perf_counter() - start
    tokens = int(tokens)
    flops = training_flops_per_target_token(
        config, trainer.tokenizers.tgt.vocab_size, source_tokens / tokens, source_tokens / sentences, tokens / sentences
    )
    peak = common.matmul_flops_per_s(device, trainer.amp_dtype, smoke=smoke)
    return {
        "updates": measured_updates,
        "target_tokens_per_update": round(tokens / measured_updates, 1),
        "target_tokens_per_s": round(tokens / seconds, 1),
        "padding_fraction": round(1 - real / padded, 4),
        "parameters": trainer.model.num_parameters(),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "peak_gpu_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None,
        "device": f"{device.type} ({str(trainer.amp_dtype or torch.float32).removeprefix('torch.')})",
        "model_mflop_per_target_token": round(flops / 1e6, 2) if flops else None,
        "matmul_gflop_per_s": round(peak / 1e9, 1),
        "mfu": round(flops * tokens / seconds / peak, 3) if flops else None,
    }


def load_engine(engine: str, model_dir: Path, device: str, workdir: Path) -> Translator:
    """pytorch, ctranslate2 (float32) or ctranslate2-int8; exports go to `workdir` (not timed)."""
    if engine == "pytorch":
        return Translator.load(model_dir, device=device)
    from mtkit.exporters.ctranslate2 import export_ctranslate2

    quantization = "int8" if engine.endswith("int8") else None
    exported = export_ctranslate2(model_dir, workdir / engine, quantization)
    return Translator.load(exported, engine="ctranslate2", device="cpu")


def benchmark_decoding(config: Config, model_dir: Path, engines: list[str]) -> dict:
    """Decode the test split at beam 5 and greedy with each engine; model loading is not timed."""
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for engine in engines:
            translator = load_engine(engine, model_dir, config.train.device, Path(workdir))
            # the output cap of the recipe as given here (--set decode.max_len_a/b), not the one saved with the run
            cap = {"max_len_a": config.decode.max_len_a, "max_len_b": config.decode.max_len_b}
            translator.decode = dataclasses.replace(translator.decode, **cap)
            results[engine] = decode_split(config, translator)
    return results


def decode_split(config: Config, translator: Translator) -> dict:
    """Sentences/s, target pieces/s and BLEU at beam 5 and greedy on the recipe's test split (else its valid split)."""
    split = (config.data.test or config.data.valid)[0]
    pairs = list(iter_split(split, config.src_lang, config.tgt_lang, config.data.normalize))
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    results = {}
    for name, beam in (("beam5", 5), ("greedy", 1)):
        start = time.perf_counter()
        best = translator.translate_nbest(sources, Decoding(beam=beam))
        seconds = time.perf_counter() - start
        pieces = sum(len(h[0].tokens) + 1 for h in best)
        bleu = score_corpus([h[0].text for h in best], [references]).scores[0].score
        results[name] = {
            "sentences_per_s": round(len(sources) / seconds, 1),
            "target_pieces_per_s": round(pieces / seconds, 1),
            "seconds": round(seconds, 2),
            "bleu": round(bleu, 2),
        }
    results["sentences"] = len(sources)
    results["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return results


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", type=Path, nargs="?", help="the recipe (none with --smoke)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override KEY=VALUE")
    parser.add_argument("--model", type=Path, help="trained run for decoding (default: the recipe's run_dir)")
    parser.add_argument(
        "--engines", default="pytorch", help="comma-separated decoding engines: pytorch, ctranslate2, ctranslate2-int8"
    )
    parser.add_argument("--warmup-updates", type=int, default=50)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument(
        "--compare-compile",
        action="store_true",
        help="also time training with train.compile=true (same batches, same run) and print the ratio",
    )
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/speed.json"))
    common.add_smoke_options(parser)
    args = parser.parse_args()
    if args.recipe is None and not args.smoke:
        parser.error("the following arguments are required: recipe")
    return args


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny recipe and its run (built in `work` the first time), a few updates, both engines."""
    args.recipe, args.model = common.smoke_recipe(work), common.smoke_run(work)
    args.engines, args.warmup_updates, args.updates = "pytorch,ctranslate2", 2, 3


def run_benchmark(args: argparse.Namespace) -> dict:
    """Decoding with each engine (when there is a trained run), then training, then compiled training if asked."""
    config = load_config(args.recipe, args.overrides)
    report = {**common.smoke_label(args), "recipe": str(args.recipe), "machine": common.machine_facts()}
    model_dir = args.model or config.run_path
    if model_dir.exists():  # decode first: its peak RSS is not masked by training's
        report["decode"] = benchmark_decoding(config, model_dir, args.engines.split(","))
    else:
        print(f"no trained run at {model_dir}: decoding skipped (pass --model RUN_DIR)", file=sys.stderr)
    report["train"] = benchmark_training(config, args.warmup_updates, args.updates, smoke=args.smoke)
    if args.compare_compile:  # compilation happens in the warm-up updates, which are not timed
        compiled = dataclasses.replace(config, train=dataclasses.replace(config.train, compile=True))
        report["train_compiled"] = benchmark_training(compiled, args.warmup_updates, args.updates, smoke=args.smoke)
    return report


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, run_benchmark, args.output)
    print_table(report)
    print(f"written to {args.output}")


def print_table(report: dict) -> None:
    train = report["train"]
    print(
        f"training: {train['target_tokens_per_s']:.0f} target tokens/s "
        f"({train['target_tokens_per_update']:.0f} per update, padding {100 * train['padding_fraction']:.1f}%, "
        f"{train['parameters'] / 1e6:.1f}M parameters), peak RSS {train['peak_rss_mb']:.0f} MB"
    )
    if train["mfu"] is not None:
        print(
            f"          {train['device']}: {train['model_mflop_per_target_token']:.1f} MFLOP per target token, matmul peak "
            f"{train['matmul_gflop_per_s']:.0f} GFLOP/s, MFU {100 * train['mfu']:.1f}%"
        )
    if train.get("peak_gpu_mb") is not None:
        print(f"          peak GPU memory {train['peak_gpu_mb']:.0f} MB")
    if "train_compiled" in report:
        compiled = report["train_compiled"]
        ratio = compiled["target_tokens_per_s"] / train["target_tokens_per_s"]
        print(f"training, train.compile=true: {compiled['target_tokens_per_s']:.0f} target tokens/s, {ratio:.2f}x eager")
    for engine, decode in report.get("decode", {}).items():
        for name in ("beam5", "greedy"):
            row = decode[name]
            print(
                f"decode {engine} {name:6}: {row['sentences_per_s']:.1f} sent/s, {row['target_pieces_per_s']:.0f} pieces/s, "
                f"BLEU {row['bleu']:.2f} ({decode['sentences']} sentences)"
            )
        print(f"decode {engine} peak RSS {decode['peak_rss_mb']:.0f} MB (process so far)")


if __name__ == "__main__":
    main()
