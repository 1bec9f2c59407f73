"""mtkit beside OpenNMT-py 3.5.1 on one machine: training and decoding speed, or BLEU after a time budget, as JSON.

    python -m benchmarks.peers [RECIPE] [--set KEY=VALUE ...] [--model RUN_DIR | --train-budget 5m]
        [--onmt-model CHECKPOINT] [--warmup-updates 50] [--updates 200] [--max-len 100]
        [--output benchmarks/results/peers.json]
    python -m benchmarks.peers [RECIPE] [--set KEY=VALUE ...] --budget 15m [--save-every 25] [--model RUN]
    (both: [--onmt-set KEY=VALUE ...], an onmt_train option over the matched ones, e.g. num_workers=0)

RECIPE defaults to recipes/multi30k/transformer.yaml; `make peers` passes the local Multi30k files.
`--smoke` runs mtkit's side in seconds on a tiny model and data (tests/corpus/), its files under
--smoke-dir; OpenNMT-py's side runs only where it is set up already (.peers/onmt-venv), else its
options and command lines are written to the JSON and it says it skipped them (it installs nothing).
A check of the whole pipeline with the real data, about 10 minutes on 2 cores once OpenNMT-py is set up:
add `--set data_dir=/tmp/peers/data --set run_dir=/tmp/peers/run --set train.batch_tokens=512
--set data.test.limit=20 --warmup-updates 2 --updates 4 --train-budget 30s --output /tmp/peers.json`.

On a fresh clone it prepares what it needs, each step shown as the command a user would type:
`mtkit tokenizer train` and `mtkit prepare` when the recipe's data directory has no tokenizer model
or prepared data; and, for the decoding comparison, the mtkit model to decode. That is --model
RUN_DIR when given, else the recipe's run_dir when it holds a checkpoint, else RUN_DIR_peers_<T>
beside it: a short run of the recipe trained by `mtkit train` for --train-budget T (default 5m:
train.max_time=T, its progress shown as it goes, then a validation; no EMA or averaging),
trained once and reused by later calls (delete it to train again). A few minutes of training give a
poor model with long outputs, like OpenNMT-py's 250-update one: compare decoding speeds with the
BLEU and output lengths beside them. --train-budget 0 trains nothing and stops without a run.

Set-up, once (benchmarks/opennmt.py; the marker .peers/onmt-venv/.installed; pip's output goes to
.peers/onmt-setup.log): OpenNMT-py pins torch<2.3, so it is installed with --no-deps into its own virtualenv beside the torch
that mtkit uses (--torch-spec, torch==2.13.0), and then only the packages its commands import (it
imports every data transform at start-up, spaCy's included). torch >= 2.6 loads checkpoints with
weights_only=True, which OpenNMT-py's own checkpoints fail, so its commands run with
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1.

The same data: mtkit's pieces. The training pairs are the recipe's prepared split (`mtkit prepare`),
written as space-separated pieces from their ids; the test sources are read and encoded as `mtkit
evaluate` reads them. OpenNMT-py's vocabulary is every piece of mtkit's SentencePiece model (its four
specials stand in for mtkit's), so both vocabularies have the same size.

The same model and settings, read from the recipe: layers, d_model, heads, ffn_dim, dropout and
attention dropout, sinusoidal positions, pre-norm (OpenNMT-py's only Transformer), biases in attention
and feed-forward (as mtkit has them), tied embeddings (share_embeddings + share_decoder_embeddings),
label smoothing, Adam (0.9, 0.98), gradient clipping, the warmup and 1/sqrt decay of `inverse_sqrt`
(exactly, as noam with learning_rate = lr * sqrt(d_model * warmup_steps)), token batches of
train.batch_tokens with the loss normalised per target token, fp32 on CPU with train.threads threads
(0: every core), the seed. Anything else is OpenNMT-py's default; the JSON lists every option given
and what could not be matched.

Speed (the default), each measurement in the order A B A (mtkit, OpenNMT-py, mtkit) so drift shows:
1. Training: target tokens/s over updates 51-250 (--warmup-updates, --updates). mtkit: speed.py's
   `benchmark_training` (its real update, on batches cut before the clock starts). OpenNMT-py:
   onmt_train for 250 updates reporting every 50. Its report lines give each window's mean target
   tokens per batch ("bsz: src/tgt/sents"); their time stamps (milliseconds) give the time from the
   end of update 50 to the end of update 250.
2. Decoding: beam 5 and greedy on the recipe's test split, both capped at --max-len output pieces
   (mtkit: decode.max_len_a=0, max_len_b=N; OpenNMT-py: -max_length N -max_length_ratio 0), decoding
   batches of decode.batch_beam_tokens source tokens x beam on both. mtkit: its Translator, model loading
   not timed. OpenNMT-py: onmt_translate's own -report_time clock, which also starts after loading.
   Sentences/s, output pieces/s (EOS counted once a sentence, as speed.py counts) and cased BLEU
   (mtkit's sacreBLEU scoring, the outputs detokenised by the same SentencePiece model, against the
   references `mtkit evaluate` reads). mtkit decodes the model chosen above (--model, the recipe's
   run_dir or the short run); OpenNMT-py decodes --onmt-model (say, the checkpoint of a --budget run)
   or else the checkpoint of its 250-update training run above, whose outputs are poor and long:
   compare decoding speeds with the BLEU and output lengths beside them.

Budget (--budget 15m): onmt_train with the recipe's settings for that much wall-clock time, counted
from its "Start training loop" line (OpenNMT-py has no time limit: it saves every --save-every
updates, is stopped at the budget, and the newest checkpoint that loads is used), then beam-5 and
greedy BLEU on the test split; beside them the mtkit run's at_<budget>.pt snapshot, when it has one
(--model RUN without such a snapshot: RUN itself, a run trained for the budget).
The budget includes what OpenNMT-py does after that line before its first update (filling its first
data bucket), as mtkit's train.max_time includes cutting its first epoch's batches.

What the counts count: mtkit's train.batch_tokens bounds sentences x the longest side, a side being
its pieces + 1 (EOS), in batches of similar target lengths; OpenNMT-py's batch_size bounds sentences x
max(source pieces, target pieces + 2) (BOS and EOS), in batches of similar source lengths. The target
tokens of an update therefore differ by a few percent, either way: both are reported. Target tokens
are the non-pad decoder outputs, EOS included, on both sides.

Run it on an otherwise idle machine: on 2 cores the speed comparison takes about 20 minutes and the
budget mode the budget plus about 2 minutes; the first run adds the set-up (a few minutes) and, on a
fresh clone, the data preparation (a minute or two) and the short mtkit run (--train-budget, plus its
validations).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from benchmarks import common, speed
from benchmarks.common import MtkitCommands, set_args
from benchmarks.opennmt import (
    installed_onmt,
    last_line,
    newest_loading_checkpoint,
    onmt_env,
    onmt_parameters,
    onmt_translation_seconds,
    onmt_versions,
    onmt_window,
    run_onmt_train,
    say,
    setup_onmt,
    shell_line,
    train_command,
)
from mtkit.config import Config, load_config, parse_duration
from mtkit.data.corpora import iter_split
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import UNK_ID, Tokenizer, load_tokenizers
from mtkit.errors import MtkitError
from mtkit.evaluation.metrics import score_corpus
from mtkit.runtime import cpu_cores, set_threads
from mtkit.textio import atomic_file, write_file
from mtkit.training.batches import IdColumn, ParallelIds

PEERS_DIR = common.ROOT / ".peers"
TRAIN_BUDGET = "5m"  # the short mtkit run trained to decode with, when there is no trained run
COUNTS = {
    "mtkit_batch": "train.batch_tokens >= sentences x max(source pieces + 1, target pieces + 1)",
    "onmt_batch": "batch_size >= sentences x max(source pieces, target pieces + 2)",
    "target_tokens": "non-pad decoder output tokens, EOS included (mtkit: Batch.num_tokens; OpenNMT-py: n_words)",
    "onmt_training_time": "time stamps of the report lines at the first and last update of the window",
    "decoded_pieces": "output pieces + 1 (EOS) a sentence; time excludes model loading on both sides",
}
# The speed figures compared as mtkit / OpenNMT-py, as paths into a run's record.
RATIO_FIGURES = {
    "training": [("target_tokens_per_s",)],
    "decoding": [(search, name) for search in ("beam5", "greedy") for name in ("sentences_per_s", "target_pieces_per_s")],
}


@dataclass
class PieceData:
    """mtkit's pieces written for OpenNMT-py, and the test split as mtkit reads it."""

    directory: Path
    tokenizer: Tokenizer  # the target side's, to detokenise OpenNMT-py's output
    joint: bool
    src_vocab_size: int
    tgt_vocab_size: int
    references: list[str]

    def path(self, name: str) -> Path:
        return self.directory / name


def trained(run: Path) -> bool:
    """Whether `run` holds a checkpoint to decode (best.pt or last.pt, which `mtkit translate -m RUN` takes)."""
    return (run / "best.pt").is_file() or (run / "last.pt").is_file()


def decoding_model(args: argparse.Namespace, config: Config) -> Path:
    """The mtkit model to decode: --model, the recipe's trained run, or a short run of the recipe (trained here once)."""
    if args.model is not None:
        say(f"mtkit decodes {args.model} (--model)")
        return args.model
    if trained(config.run_path):
        say(f"mtkit decodes the recipe's run {config.run_path} (--model RUN_DIR decodes another)")
        return config.run_path
    short = Path(f"{config.run_path}_peers_{args.train_budget}")
    if trained(short):
        say(f"mtkit decodes {short}, trained for {args.train_budget} by an earlier call (delete it to train again)")
        return short
    if not parse_duration(args.train_budget):
        raise MtkitError(
            f"{config.run_path}: no trained mtkit run to decode with; run `mtkit train {args.recipe}` first, "
            "pass --model RUN_DIR, or give --train-budget 5m to train a short one here"
        )
    say(
        f"{config.run_path}: no trained mtkit run; training the recipe for {args.train_budget} into {short} to decode "
        "with (--train-budget; --model RUN_DIR decodes another)"
    )
    train_short_run(args.recipe, args.overrides, short, args.train_budget)
    return short


def train_short_run(recipe: Path, overrides: list[str], run: Path, budget: str) -> None:
    """`mtkit train` of the recipe into `run` for `budget` (train.max_time), on the CPU as everything here.

    No EMA or averaging: they would only add validations to a run that is only decoded.
    """
    settings = [f"run_dir={run}", f"train.max_time={budget}", "train.ema=0", "train.average_last=0", "train.device=cpu"]
    output = MtkitCommands().run(["train", recipe, *set_args([*overrides, *settings])])
    print(output, file=sys.stderr, end="")


def piece_table(tokenizer: Tokenizer) -> np.ndarray:
    """Every piece of the model by id, as an array to index with id arrays."""
    return np.array(tokenizer.id_to_piece(range(tokenizer.vocab_size)), dtype=object)


def write_pieces(path: Path, column: IdColumn, table: np.ndarray) -> None:
    with atomic_file(path) as out:
        for index in range(len(column.lengths)):
            out.write(" ".join(table[column[index]]) + "\n")


def write_vocab(path: Path, table: np.ndarray) -> None:
    """OpenNMT-py's vocabulary file: the pieces after mtkit's 4 specials; OpenNMT-py adds its own 4."""
    write_file(path, "".join(f"{piece}\n" for piece in table[4:]))


def write_piece_data(config: Config, directory: Path) -> PieceData:
    """The prepared training pairs and the test sources as space-separated pieces, and the vocabularies."""
    tokenizers = load_tokenizers(config.data_path, config.tokenizer.joint)
    train = ParallelIds(load_prepared(config.data_path, "train"))
    directory.mkdir(parents=True, exist_ok=True)
    src_table, tgt_table = piece_table(tokenizers.src), piece_table(tokenizers.tgt)
    write_pieces(directory / "train.src", train.src, src_table)
    write_pieces(directory / "train.tgt", train.tgt, tgt_table)
    write_vocab(directory / "vocab.src", src_table)
    write_vocab(directory / "vocab.tgt", tgt_table)
    assert config.data.test is not None  # checked in check_inputs
    pairs = list(iter_split(config.data.test[0], config.src_lang, config.tgt_lang, config.data.normalize, "data.test"))
    with atomic_file(directory / "test.src") as out:
        for ids in tokenizers.src.encode_batch([source for source, _ in pairs]):
            out.write(" ".join(src_table[ids]) + "\n")
    return PieceData(
        directory,
        tokenizers.tgt,
        tokenizers.joint,
        tokenizers.src.vocab_size,
        tokenizers.tgt.vocab_size,
        [target for _, target in pairs],
    )


def detokenise(lines: list[str], tokenizer: Tokenizer) -> list[str]:
    """OpenNMT-py's output pieces as text, through mtkit's own decode (its <unk> is mtkit's)."""
    ids = {piece: index for index, piece in enumerate(tokenizer.id_to_piece(range(tokenizer.vocab_size)))}
    return [tokenizer.decode([ids.get(piece, UNK_ID) for piece in line.split()]) for line in lines]


def onmt_options(config: Config, data: PieceData, run: Path, steps: int, report_every: int, save_every: int, extra: dict) -> dict:
    """onmt_train's options for the recipe's model and training settings (see the module docstring), then `extra`."""
    model, train = config.model, config.train
    tied = model.tie_embeddings and data.joint
    return {
        "data": {"corpus_1": {"path_src": str(data.path("train.src")), "path_tgt": str(data.path("train.tgt"))}},
        "src_vocab": str(data.path("vocab.src")),
        "tgt_vocab": str(data.path("vocab.tgt")),
        "share_vocab": data.joint,
        "src_vocab_size": data.src_vocab_size,
        "tgt_vocab_size": data.tgt_vocab_size,
        "vocab_size_multiple": 1,
        "save_model": str(run / "model"),
        "save_checkpoint_steps": save_every,
        "keep_checkpoint": 2,
        "train_steps": steps,
        "report_every": report_every,
        "seed": train.seed,
        "encoder_type": "transformer",
        "decoder_type": "transformer",
        "enc_layers": model.encoder_layers or model.layers,
        "dec_layers": model.decoder_layers or model.layers,
        "hidden_size": model.d_model,
        "word_vec_size": model.d_model,
        "transformer_ff": model.ffn_dim,
        "heads": model.heads,
        "dropout": [model.dropout],
        "attention_dropout": [model.attention_dropout],
        "position_encoding": True,
        "add_qkvbias": True,
        "add_ffnbias": True,
        "share_embeddings": tied,
        "share_decoder_embeddings": tied,
        "param_init": 0.0,
        "param_init_glorot": True,
        "optim": "adam",
        "adam_beta1": 0.9,
        "adam_beta2": 0.98,
        "decay_method": "noam",
        "learning_rate": train.lr * math.sqrt(model.d_model * train.warmup_steps),
        "warmup_steps": train.warmup_steps,
        "max_grad_norm": train.clip_norm,
        "label_smoothing": train.label_smoothing,
        "batch_type": "tokens",
        "batch_size": train.batch_tokens,
        "batch_size_multiple": 1,
        "normalization": "tokens",
        "accum_count": [train.accumulate],
        "model_dtype": "fp32",
        **extra,
    }


def differences(config: Config) -> list[str]:
    """The recipe's settings that OpenNMT-py 3.5.1 cannot match here."""
    model, train = config.model, config.train
    found = [
        "Adam eps: OpenNMT-py 1e-8, mtkit 1e-9",
        "LayerNorm eps: OpenNMT-py 1e-6, mtkit 1e-5",
        "output layer: OpenNMT-py's has a bias (vocabulary-size more parameters), mtkit's none",
        "initialisation: OpenNMT-py draws every matrix, embeddings included, Xavier-uniform (embedding std 0.016"
        " for 8,000 x 256 before the sqrt(d_model) scale); mtkit draws embeddings from N(0, 1/d_model)",
        "batches: OpenNMT-py reads the corpus in file order and stable-sorts it by length (one bucket of up to"
        " 262,144 pairs), so the same batches recur every epoch in a new order; mtkit shuffles before sorting,"
        " so pairs of equal length form new batches every epoch",
    ]
    if model.norm == "post":
        found.append("model.norm=post: OpenNMT-py's Transformer is pre-norm only")
    if model.positions == "learned":
        found.append("model.positions=learned: OpenNMT-py 3.5.1 has sinusoidal positions only")
    if train.schedule != "inverse_sqrt":
        found.append(f"train.schedule={train.schedule}: OpenNMT-py has no such decay; noam (inverse_sqrt) used")
    if config.tokenizer.sampling_alpha:
        found.append("tokenizer.sampling_alpha: OpenNMT-py trains on the best segmentation, mtkit re-samples it each epoch")
    if any(source.weight != 1.0 for source in config.data.train):
        found.append("data.train weights: OpenNMT-py reads every prepared training pair once an epoch")
    if train.ema or train.average_last:
        found.append("train.ema / train.average_last: not used by OpenNMT-py here")
    return found


def onmt_training(
    bin_dir: Path,
    config: Config,
    data: PieceData,
    run: Path,
    window: tuple[int, int],
    threads: int,
    extra: dict,
    skip: str | None = None,
) -> dict:
    """OpenNMT-py's training speed over updates warmup+1..warmup+updates (it then saves its only checkpoint).

    `skip` (--smoke without OpenNMT-py): its options written to run/train.yaml and its command line, nothing run.
    """
    (warmup, updates), steps = window, sum(window)
    report_every = math.gcd(warmup, updates)
    options = onmt_options(config, data, run, steps, report_every, steps, extra)
    if skip is not None:
        say(f"{skip}: onmt_train not run; its options are in {run / 'train.yaml'}")
        run.mkdir(parents=True, exist_ok=True)
        write_file(run / "train.yaml", yaml.safe_dump(options, sort_keys=False))
        command = shell_line(train_command(bin_dir, run))
        return {"checkpoint": str(run / f"model_step_{steps}.pt"), "command": command, "options": options}
    trained = run_onmt_train(bin_dir, options, run, threads, budget=None)
    measured = onmt_window(run / "train.log", warmup, steps, report_every * config.train.accumulate)
    assert trained.peak_rss_mb is not None  # it ran to its end
    return {
        **measured,
        "parameters": onmt_parameters(run / "train.log"),
        "peak_rss_mb": round(trained.peak_rss_mb, 1),  # onmt_train's own (its data-loader workers included)
        "checkpoint": str(run / f"model_step_{steps}.pt"),
        "command": shell_line(trained.command),
        "options": options,
    }


def translate_command(
    bin_dir: Path, config: Config, model: Path, source: Path, output: Path, beam: int, max_len: int
) -> list[str]:
    """onmt_translate with mtkit's decoding settings: the same cap, length penalty and batch size."""
    alpha = config.decode.length_penalty
    penalty = {0.0: "none", 1.0: "avg"}.get(alpha, "wu")  # mtkit divides by length**alpha; wu is ((5+len)/6)**alpha
    command = [str(bin_dir / "onmt_translate"), "-model", str(model), "-src", str(source), "-output", str(output)]
    command += ["-beam_size", str(beam), "-max_length", str(max_len), "-max_length_ratio", "0"]
    command += ["-length_penalty", penalty, "-alpha", str(alpha), "-gpu", "-1", "-seed", str(config.train.seed)]
    command += ["-batch_type", "tokens", "-batch_size", str(max(1, config.decode.batch_beam_tokens // beam)), "-report_time"]
    if beam == 1:
        command += ["-random_sampling_topk", "1"]  # its greedy search (argmax), not a beam of one
    return command


def onmt_decoding(
    bin_dir: Path, config: Config, data: PieceData, model: Path, max_len: int, threads: int, skip: str | None = None
) -> dict:
    """onmt_translate at beam 5 and greedy on the test sources: speed by its own clock, BLEU by mtkit's scoring.

    `skip` (--smoke without OpenNMT-py): the command lines only.
    """
    results: dict = {"model": str(model), "commands": []}
    for name, beam in (("beam5", 5), ("greedy", 1)):
        output = data.path(f"test.{name}.onmt")
        command = translate_command(bin_dir, config, model, data.path("test.src"), output, beam, max_len)
        if skip is not None:
            results["commands"].append(shell_line(command))
            continue
        run = subprocess.run(command, capture_output=True, text=True, env=onmt_env(threads))
        if run.returncode != 0:
            raise MtkitError(f"onmt_translate failed ({last_line(run.stderr + run.stdout)})")
        lines = output.read_text(encoding="utf-8").splitlines()
        words = sum(len(line.split()) for line in lines)
        seconds = onmt_translation_seconds(run.stderr + run.stdout, words)
        bleu = score_corpus(detokenise(lines, data.tokenizer), [data.references]).scores[0].score
        results[name] = {
            "sentences_per_s": round(len(lines) / seconds, 1),
            "target_pieces_per_s": round((words + len(lines)) / seconds, 1),
            "seconds": round(seconds, 2),
            "bleu": round(bleu, 2),
        }
        results["commands"].append(shell_line(command))
    results["sentences"] = len(data.references)
    return results


def mtkit_decoding(config: Config, model: Path, max_len: int) -> dict:
    """speed.py's decoding of the test split, with the recipe's decode settings and the fixed output cap."""
    from mtkit.decoding.translator import Translator

    translator = Translator.load(model, device="cpu", fast_paths=True)
    translator.decode = dataclasses.replace(config.decode, max_len_a=0.0, max_len_b=max_len)
    return {"model": str(model), **speed.decode_split(config, translator)}


def machine(bin_dir: Path | None) -> dict:
    """This machine, mtkit's torch and OpenNMT-py's (its versions None where it is not set up: --smoke)."""
    import torch

    onmt_torch, onmt_version = onmt_versions(bin_dir) if bin_dir is not None else (None, None)
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "cores_available": cpu_cores(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "mtkit_torch": torch.__version__,
        "onmt_torch": onmt_torch,
        "opennmt_py": onmt_version,
    }


def speed_report(args: argparse.Namespace, config: Config, bin_dir: Path, data: PieceData, threads: int, model: Path) -> dict:
    """Training, then decoding (mtkit's `model`), each as mtkit, OpenNMT-py, mtkit; the fp32 matmul peak before and after.

    Without OpenNMT-py (--smoke only: args.onmt_missing says why) its side is written out, not run.
    """
    say("measuring the fp32 matmul peak")
    report: dict = {"matmul_gflop_per_s": {"start": common.matmul_gflop_per_s(smoke=args.smoke)}}
    runs, onmt = training_speed(args, config, bin_dir, data, threads)
    onmt_model = args.onmt_model or Path(onmt["checkpoint"])
    searches = f"beam 5 and greedy on {len(data.references)} test sentences"
    say(f"decoding speed 1/3: mtkit, {searches} ({model})")
    runs.append({"toolkit": "mtkit", "measure": "decoding", **mtkit_decoding(config, model, args.max_len)})
    say(f"decoding speed 2/3: OpenNMT-py, {searches} ({onmt_model})")
    onmt_decode = onmt_decoding(bin_dir, config, data, onmt_model, args.max_len, threads, args.onmt_missing)
    if args.onmt_missing is None:
        runs.append({"toolkit": "OpenNMT-py", "measure": "decoding", **onmt_decode})
    say(f"decoding speed 3/3: mtkit, {searches}")
    runs.append({"toolkit": "mtkit", "measure": "decoding", **mtkit_decoding(config, model, args.max_len)})
    report["matmul_gflop_per_s"]["end"] = common.matmul_gflop_per_s(smoke=args.smoke)
    report["runs"] = runs
    report["ratios"] = ratios(runs) if args.onmt_missing is None else {}
    report["onmt_commands"] = [onmt["command"], *onmt_decode["commands"]]
    if args.onmt_missing is not None:
        report["onmt_skipped"] = {"reason": args.onmt_missing, "options": onmt["options"]}
    return report


def training_speed(
    args: argparse.Namespace, config: Config, bin_dir: Path, data: PieceData, threads: int
) -> tuple[list[dict], dict]:
    """mtkit, OpenNMT-py, mtkit over the same window of updates: their records, and OpenNMT-py's (run or not)."""
    window = f"updates {args.warmup_updates + 1}-{args.warmup_updates + args.updates}"
    say(f"training speed 1/3: mtkit, {window}")
    runs = [mtkit_training(args, config)]
    run_dir = args.peers_work / "runs" / f"{config.name}-speed"
    say(f"training speed 2/3: OpenNMT-py, {window} (its log: {run_dir / 'train.log'})")
    span = (args.warmup_updates, args.updates)
    onmt = onmt_training(bin_dir, config, data, run_dir, span, threads, args.onmt_options, args.onmt_missing)
    if args.onmt_missing is None:
        runs.append({"toolkit": "OpenNMT-py", "measure": "training", **onmt})
    say(f"training speed 3/3: mtkit, {window}")
    runs.append(mtkit_training(args, config))
    return runs, onmt


def mtkit_training(args: argparse.Namespace, config: Config) -> dict:
    """speed.py's `benchmark_training` over the window, as one record of the comparison."""
    measured = speed.benchmark_training(config, args.warmup_updates, args.updates, smoke=args.smoke)
    return {"toolkit": "mtkit", "measure": "training", **measured}


def budget_report(args: argparse.Namespace, config: Config, bin_dir: Path, data: PieceData, threads: int) -> dict:
    """OpenNMT-py trained for the budget with the recipe's settings, its test BLEU, and mtkit's snapshot of that time."""
    budget = parse_duration(args.budget) or 0.0
    report: dict = {"budget": args.budget, "budget_s": budget, "runs": []}
    run_dir = args.peers_work / "runs" / f"{config.name}-budget-{args.budget}"
    options = onmt_options(config, data, run_dir, 10_000_000, config.train.log_every, args.save_every, args.onmt_options)
    if args.onmt_missing is None:
        report["runs"].append(onmt_budget_run(args, config, bin_dir, data, threads, options, run_dir))
        report["onmt_commands"] = [report["runs"][0]["command"], *report["runs"][0]["decode"]["commands"]]
    else:
        say(f"{args.onmt_missing}: OpenNMT-py not trained for {args.budget}")
        report["onmt_commands"] = [shell_line(train_command(bin_dir, run_dir))]
        report["onmt_skipped"] = {"reason": args.onmt_missing, "options": options}
    snapshot = (args.model or config.run_path) / f"at_{args.budget}.pt"
    if not snapshot.is_file() and args.model is not None:
        snapshot = args.model  # a run trained for the budget (train.max_time) is its own snapshot
    if snapshot.exists():
        say(f"decoding the test split with mtkit's {snapshot}, beam 5 and greedy")
        decode = mtkit_decoding(config, snapshot, args.max_len)
        report["runs"].append({"toolkit": "mtkit", "decode": decode})
    else:
        say(f"no mtkit snapshot {snapshot} (train.snapshots, or --model RUN trained for {args.budget}): OpenNMT-py's BLEU only")
    return report


def onmt_budget_run(
    args: argparse.Namespace, config: Config, bin_dir: Path, data: PieceData, threads: int, options: dict, run_dir: Path
) -> dict:
    """onmt_train for the budget (stopped then), and its newest checkpoint that loads decoding the test split."""
    say(f"training OpenNMT-py for {args.budget} (its log: {run_dir / 'train.log'})")
    trained = run_onmt_train(bin_dir, options, run_dir, threads, parse_duration(args.budget) or 0.0)
    checkpoint = newest_loading_checkpoint(bin_dir, run_dir, threads)
    say(f"decoding the test split with OpenNMT-py's {checkpoint}, beam 5 and greedy")
    return {
        "toolkit": "OpenNMT-py",
        "updates": int(checkpoint.stem.rsplit("_", 1)[1]),
        "checkpoint_written_after_s": round(checkpoint.stat().st_mtime - trained.started, 1),
        "parameters": onmt_parameters(run_dir / "train.log"),
        "command": shell_line(trained.command),
        "options": options,
        "decode": onmt_decoding(bin_dir, config, data, checkpoint, args.max_len, threads),
    }


def ratios(runs: list[dict]) -> dict:
    """mtkit (the mean of its two runs) / OpenNMT-py, for each speed figure."""
    ratio = {}
    for measure, keys in RATIO_FIGURES.items():
        mtkit = [run for run in runs if run["measure"] == measure and run["toolkit"] == "mtkit"]
        onmt = next(run for run in runs if run["measure"] == measure and run["toolkit"] == "OpenNMT-py")
        for key in keys:
            ours = sum(figure(run, key) for run in mtkit) / len(mtkit)
            ratio[".".join((measure, *key))] = round(ours / figure(onmt, key), 3)
    return ratio


def figure(run: dict, key: tuple[str, ...]) -> float:
    value = run
    for part in key:
        value = value[part]
    return float(value)


def print_speed(report: dict) -> None:
    runs = report["runs"]
    training = [run for run in runs if run["measure"] == "training"]
    decoding = [run for run in runs if run["measure"] == "decoding"]
    names = [f"{run['toolkit']}" for run in training]
    print(f"{'':34}" + "".join(f"{name:>13}" for name in names) + f"{'ratio':>9}")
    rows = [("training target tokens/s", training, ("target_tokens_per_s",), "training.target_tokens_per_s")]
    rows.append(("  target tokens per update", training, ("target_tokens_per_update",), None))
    for search in ("beam5", "greedy"):
        rows.append((f"{search} sentences/s", decoding, (search, "sentences_per_s"), f"decoding.{search}.sentences_per_s"))
        rows.append(
            (f"{search} output pieces/s", decoding, (search, "target_pieces_per_s"), f"decoding.{search}.target_pieces_per_s")
        )
        rows.append((f"  {search} BLEU", decoding, (search, "bleu"), None))
    for label, group, key, ratio_key in rows:
        ratio = f"{report['ratios'][ratio_key]:>8.2f}x" if ratio_key in report["ratios"] else ""  # none: OpenNMT-py skipped
        print(f"{label:34}" + "".join(f"{figure(run, key):>13.1f}" for run in group) + ratio)
    peaks = report["matmul_gflop_per_s"]
    print(f"fp32 matmul peak: {peaks['start']:.0f} GFLOP/s at the start, {peaks['end']:.0f} at the end")
    for run in decoding:
        sentences = run["sentences"]
        lengths = [run[s]["target_pieces_per_s"] / run[s]["sentences_per_s"] for s in ("beam5", "greedy")]
        print(f"{run['toolkit']} decoded {run['model']}: {lengths[0]:.1f} / {lengths[1]:.1f} pieces a sentence ({sentences})")
    if "onmt_skipped" in report:
        print(f"OpenNMT-py skipped: {report['onmt_skipped']['reason']}")


def print_budget(report: dict) -> None:
    onmt = next((run for run in report["runs"] if run["toolkit"] == "OpenNMT-py"), None)
    if onmt is None:
        print(f"OpenNMT-py after {report['budget']}: skipped ({report['onmt_skipped']['reason']})")
    else:
        print(
            f"OpenNMT-py after {report['budget']}: {onmt['updates']} updates "
            f"(checkpoint written {onmt['checkpoint_written_after_s']:.0f} s into training)"
        )
    for run in report["runs"]:
        decode = run["decode"]
        print(
            f"{run['toolkit']:>10} test BLEU: beam 5 {decode['beam5']['bleu']:.2f}, greedy {decode['greedy']['bleu']:.2f} "
            f"({decode['model']})"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", type=Path, nargs="?", default=Path("recipes/multi30k/transformer.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override KEY=VALUE")
    parser.add_argument(
        "--model", type=Path, help="mtkit run to decode with (default: the recipe's run_dir, else a short run: --train-budget)"
    )
    parser.add_argument(
        "--train-budget",
        default=TRAIN_BUDGET,
        help=f"without --model or a trained run_dir: train the recipe this long to decode (default {TRAIN_BUDGET}; 0: never)",
    )
    parser.add_argument("--onmt-model", type=Path, help="OpenNMT-py checkpoint to decode with (default: its speed run's)")
    parser.add_argument("--warmup-updates", type=int, default=50, help="updates before the timed window (at least 1)")
    parser.add_argument("--updates", type=int, default=200, help="updates in the timed window")
    parser.add_argument("--max-len", type=int, default=100, help="output cap in pieces (EOS not counted), on both sides")
    parser.add_argument("--budget", help="instead of speed: train OpenNMT-py for this long (15m, 1h) and score it")
    parser.add_argument("--save-every", type=int, default=25, help="--budget: OpenNMT-py's updates between checkpoints")
    parser.add_argument(
        "--onmt-set", dest="onmt_set", action="append", default=[], help="an onmt_train option KEY=VALUE (num_workers=0)"
    )
    parser.add_argument("--torch-spec", default="torch==2.13.0", help="the torch installed beside OpenNMT-py")
    parser.add_argument("--output", type=Path, help="JSON (default benchmarks/results/peers.json, or peers_budget.json)")
    common.add_smoke_options(parser)
    parser.set_defaults(peers_work=PEERS_DIR, onmt_missing=None)  # --smoke: its own folder, OpenNMT-py perhaps missing
    args = parser.parse_args()
    if min(args.warmup_updates, args.updates, args.max_len, args.save_every) < 1:
        parser.error("--warmup-updates, --updates, --max-len and --save-every must be at least 1")
    for option, value in (("--budget", args.budget), ("--train-budget", args.train_budget)):
        try:
            parse_duration(value)
        except MtkitError:
            parser.error(f"{option} {value!r}: give a duration such as 15m, 1h or 600s")
    args.onmt_options = {}
    for option in args.onmt_set:
        key, equals, value = option.partition("=")
        if not equals or not key:
            parser.error(f"--onmt-set {option!r}: give KEY=VALUE, e.g. num_workers=0")
        args.onmt_options[key] = yaml.safe_load(value)
    args.output = args.output or Path("benchmarks/results") / ("peers_budget.json" if args.budget else "peers.json")
    return args


def check_inputs(args: argparse.Namespace, config: Config) -> None:
    """One-line errors, before anything long runs, for what the benchmark needs, cannot make itself and does not find."""
    if config.model.arch != "transformer":
        raise MtkitError(f"{args.recipe}: model.arch is {config.model.arch}; peers.py compares Transformers")
    if config.data.test is None:
        raise MtkitError(f"{args.recipe}: the recipe has no data.test; set it to the test split (test2016)")
    if args.model is not None and not args.model.exists():
        raise MtkitError(f"{args.model}: no such mtkit run or checkpoint; give a run_dir trained by `mtkit train`")
    if args.onmt_model is not None and not args.onmt_model.is_file():
        raise MtkitError(f"{args.onmt_model}: no such OpenNMT-py checkpoint; give one written by a --budget run")


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny recipe and run (built in `work` the first time), a few updates, OpenNMT-py only if set up."""
    args.recipe, args.overrides, args.peers_work = common.smoke_recipe(work), [], work / "peers"
    args.warmup_updates, args.updates, args.max_len = 2, 3, 5
    if installed_onmt(PEERS_DIR / "onmt-venv", args.torch_spec) is None:
        args.onmt_missing = f"OpenNMT-py is not set up in {PEERS_DIR / 'onmt-venv'} (`make peers` sets it up)"


def compare(args: argparse.Namespace) -> dict:
    """Prepare what is missing, write mtkit's pieces for OpenNMT-py, then the speed or the budget comparison."""
    config = load_config(args.recipe, args.overrides)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, device="cpu"))  # both on CPU
    check_inputs(args, config)
    threads = config.train.threads or cpu_cores()
    set_threads(threads)
    common.ensure_prepared(MtkitCommands(in_process=args.smoke), args.recipe, args.overrides)
    venv = PEERS_DIR / "onmt-venv"
    bin_dir = setup_onmt(venv, args.torch_spec) if args.onmt_missing is None else venv / "bin"
    model = None if args.budget else decoding_model(args, config)
    say(f"writing mtkit's pieces and vocabulary for OpenNMT-py to {args.peers_work / 'data' / config.name}")
    data = write_piece_data(config, args.peers_work / "data" / config.name)
    report = {
        **common.smoke_label(args),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "recipe": str(args.recipe),
        "overrides": args.overrides,
        "machine": machine(bin_dir if args.onmt_missing is None else None),
        "counts": COUNTS,
        "not_matched": differences(config),
    }
    if model is None:
        report.update(budget_report(args, config, bin_dir, data, threads))
    else:
        report.update(speed_report(args, config, bin_dir, data, threads, model))
    return report


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, compare, args.output)
    (print_budget if args.budget else print_speed)(report)
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
