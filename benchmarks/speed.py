"""Speed and memory benchmark for a recipe: training throughput and decoding speed, printed and as JSON.

    python -m benchmarks.speed recipes/multi30k/transformer.yaml [--set KEY=VALUE ...] [--model RUN_DIR]
        [--engines pytorch,ctranslate2,ctranslate2-int8] [--compare-compile] [--profile UPDATES] [--smoke]

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
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.evaluation.metrics import score_corpus
from mtkit.training.batch_ahead import BatchAhead
from mtkit.training.batches import round_up
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


class TimedTraining:
    """A trainer set up as `mtkit train` sets it up, without a run directory (nothing is written),
    stepping through its first epoch's batches (over again when they run out) with the trainer's own
    step: its levers, its look-ahead, its one host sync an update. The figures of a window come from
    the batches' lengths on the host, so counting them adds no sync."""

    def __init__(self, config: Config) -> None:
        self.config = config
        distributed, self.device = setup_process(config.train)
        self.trainer = Trainer(config, self.device, distributed=distributed)
        epoch = self.trainer.epoch()
        self.ahead = BatchAhead(epoch, 1, device=self.device, levers=self.trainer.levers)
        self.src_lengths, self.tgt_lengths = epoch.ids.src.lengths + 1, epoch.ids.tgt.lengths + 1  # + EOS
        self.batches, self.position = epoch.batches, 0

    def steps(self, updates: int) -> dict[str, int]:
        """Make `updates` optimiser updates; their target tokens, padded target positions, source tokens, sentences."""
        counts = dict.fromkeys(("tokens", "padded", "source_tokens", "sentences"), 0)
        multiple = self.trainer.levers.length_multiple
        for _ in range(updates):
            start = self.position % len(self.batches)
            indices, self.position = self.batches[start], self.position + 1
            tgt = self.tgt_lengths[indices]
            counts["tokens"] += int(tgt.sum())
            counts["padded"] += len(indices) * round_up(int(tgt.max()), multiple)
            counts["source_tokens"] += int(self.src_lengths[indices].sum())
            counts["sentences"] += len(indices)
            group = self.ahead.take(start)
            self.trainer.update(group, self.ahead.while_waiting(self.position % len(self.batches)))
        return counts

    def window(self, updates: int, peak: float) -> dict:
        """Time `updates` updates: target tokens/s, padding, peak memory and MFU against the matmul `peak` FLOP/s."""
        common.synchronize(self.device)
        start = time.perf_counter()
        counts = self.steps(updates)
        common.synchronize(self.device)
        seconds = time.perf_counter() - start
        tokens, sentences, trainer = counts["tokens"], counts["sentences"], self.trainer
        flops = training_flops_per_target_token(
            self.config,
            trainer.tokenizers.tgt.vocab_size,
            counts["source_tokens"] / tokens,
            counts["source_tokens"] / sentences,
            tokens / sentences,
        )
        cuda = self.device.type == "cuda"
        return {
            "updates": updates,
            "target_tokens_per_update": round(tokens / updates, 1),
            "target_tokens_per_s": round(tokens / seconds, 1),
            "padding_fraction": round(1 - tokens / counts["padded"], 4),
            "parameters": trainer.model.num_parameters(),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "peak_gpu_mb": round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1) if cuda else None,
            "device": f"{self.device.type} ({str(trainer.amp_dtype or torch.float32).removeprefix('torch.')})",
            "levers": trainer.levers.describe(),
            "model_mflop_per_target_token": round(flops / 1e6, 2) if flops else None,
            "matmul_gflop_per_s": round(peak / 1e9, 1),
            "mfu": round(flops * tokens / seconds / peak, 3) if flops else None,
        }


def benchmark_training(config: Config, warmup_updates: int, measured_updates: int, *, smoke: bool = False) -> dict:
    """Time `measured_updates` optimiser updates after `warmup_updates` (compilation, if on, happens in those).

    `smoke`: the matmul peak of a small matrix (a figure that means nothing).
    """
    timed = TimedTraining(config)
    timed.steps(warmup_updates)
    return timed.window(measured_updates, common.matmul_flops_per_s(timed.device, timed.trainer.amp_dtype, smoke=smoke))


PROFILED_PARTS = ("forward", "backward", "optimizer", "data")  # the step's record_function labels, "mtkit.<part>"


def profile_split(timed: TimedTraining, updates: int) -> dict:
    """Where `updates` updates spend their time, from the PyTorch profiler: each labelled part's device
    time (CPU time on the CPU), the device's busy time in all, and the wall time it leaves idle (the
    host gaps), in ms per update; and the ten kernels that take longest.

    Backward kernels run on autograd's own thread, outside the main thread's labels: the device time
    no label claims (backward, gradient clipping, the loss scaler) is given as "backward and rest".
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = timed.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    common.synchronize(timed.device)
    start = time.perf_counter()
    with profile(activities=activities) as profiler:
        timed.steps(updates)
        common.synchronize(timed.device)
    wall_ms = (time.perf_counter() - start) * 1e3 / updates
    events = profiler.key_averages()
    time_of = (lambda e: e.device_time_total) if cuda else (lambda e: e.cpu_time_total)
    parts = {part: 0.0 for part in PROFILED_PARTS}
    for event in events:
        if event.key.startswith("mtkit.") and event.key[6:] in parts:
            parts[event.key[6:]] += time_of(event) / 1e3 / updates
    # the kernels themselves (each is also in its launching operator's self device time: counted once here)
    kernels = [e for e in events if cuda and e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
    busy_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / updates if cuda else sum(parts.values())
    parts["backward"] = max(parts["backward"], busy_ms - parts["forward"] - parts["optimizer"] - parts["data"])
    top = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:10]
    return {
        "updates": updates,
        "wall_ms_per_update": round(wall_ms, 2),
        "device_busy_ms_per_update": round(busy_ms, 2),
        "host_gap_ms_per_update": round(max(wall_ms - busy_ms, 0.0), 2),
        "parts_ms_per_update": {("backward and rest" if k == "backward" else k): round(v, 2) for k, v in parts.items()},
        "top_kernels_ms_per_update": {e.key[:90]: round(e.self_device_time_total / 1e3 / updates, 3) for e in top},
    }


def load_engine(engine: str, model_dir: Path, device: str, workdir: Path) -> Translator:
    """pytorch, ctranslate2 (float32) or ctranslate2-int8; exports go to `workdir` (not timed)."""
    if engine == "pytorch":
        return Translator.load(model_dir, device=device, fast_paths=True)
    from mtkit.exporters.ctranslate2 import export_ctranslate2

    quantization = "int8" if engine.endswith("int8") else None
    exported = export_ctranslate2(model_dir, workdir / engine, quantization=quantization)
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
    pairs = list(iter_split(split, config.src_lang, tgt_lang=config.tgt_lang, normalize=config.data.normalize))
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
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="UPDATES",
        help="after the timed window, profile this many more updates and print where a step's time goes",
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
    args.engines, args.warmup_updates, args.updates, args.profile = "pytorch,ctranslate2", 2, 3, 2


def run_benchmark(args: argparse.Namespace) -> dict:
    """Decoding with each engine (when there is a trained run), then training, then compiled training if asked."""
    config = load_config(args.recipe, args.overrides)
    report = {**common.smoke_label(args), "recipe": str(args.recipe), "machine": common.machine_facts()}
    model_dir = args.model or config.run_path
    if model_dir.exists():  # decode first: its peak RSS is not masked by training's
        report["decode"] = benchmark_decoding(config, model_dir, args.engines.split(","))
    else:
        print(f"no trained run at {model_dir}: decoding skipped (pass --model RUN_DIR)", file=sys.stderr)
    timed = TimedTraining(config)
    timed.steps(args.warmup_updates)
    peak = common.matmul_flops_per_s(timed.device, timed.trainer.amp_dtype, smoke=args.smoke)
    report["train"] = timed.window(args.updates, peak)
    if args.profile:
        report["profile"] = profile_split(timed, args.profile)
    if args.compare_compile:  # compilation happens in the warm-up updates, which are not timed
        compiled = dataclasses.replace(config, train=dataclasses.replace(config.train, compile="true"))
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
    if "profile" in report:
        print_profile(report["profile"])
    for engine, decode in report.get("decode", {}).items():
        for name in ("beam5", "greedy"):
            row = decode[name]
            print(
                f"decode {engine} {name:6}: {row['sentences_per_s']:.1f} sent/s, {row['target_pieces_per_s']:.0f} pieces/s, "
                f"BLEU {row['bleu']:.2f} ({decode['sentences']} sentences)"
            )
        print(f"decode {engine} peak RSS {decode['peak_rss_mb']:.0f} MB (process so far)")


def print_profile(split: dict) -> None:
    """The profiler's split of one update, in ms."""
    parts = ", ".join(f"{name} {ms:.1f}" for name, ms in split["parts_ms_per_update"].items())
    print(
        f"profile ({split['updates']} updates), ms per update: wall {split['wall_ms_per_update']:.1f}, device busy "
        f"{split['device_busy_ms_per_update']:.1f}, host gaps {split['host_gap_ms_per_update']:.1f}; {parts}"
    )
    for name, ms in split["top_kernels_ms_per_update"].items():
        print(f"    {ms:8.3f} ms  {name}")


if __name__ == "__main__":
    main()
