"""mtkit beside OpenNMT-py 3.5.1 on one machine: training and decoding speed, or BLEU after a time budget, as JSON.

    python benchmarks/peers.py [RECIPE] [--set KEY=VALUE ...] [--model RUN_DIR | --train-budget 5m]
        [--onmt-model CHECKPOINT] [--warmup-updates 50] [--updates 200] [--max-len 100]
        [--output benchmarks/results/peers.json]
    python benchmarks/peers.py [RECIPE] [--set KEY=VALUE ...] --budget 15m [--save-every 25] [--model RUN]
    (both: [--onmt-set KEY=VALUE ...], an onmt_train option over the matched ones, e.g. num_workers=0)

RECIPE defaults to recipes/multi30k/transformer.yaml; `make peers` passes the local Multi30k files.
A smoke test of the whole pipeline on a fresh clone, about 10 minutes on 2 cores once OpenNMT-py is set up:
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

Set-up, once (the marker .peers/onmt-venv/.installed; pip's output goes to .peers/onmt-setup.log):
OpenNMT-py pins torch<2.3, so it is installed with --no-deps into its own virtualenv beside the torch
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
import json
import math
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from mtkit.config import Config, load_config, parse_duration
from mtkit.data.corpora import iter_split
from mtkit.data.store import REPORT_FILE, load_prepared
from mtkit.data.tokenizer import UNK_ID, Tokenizer, load_tokenizers, tokenizer_files
from mtkit.errors import MtkitError, one_line
from mtkit.evaluation.metrics import score_corpus
from mtkit.runtime import cpu_cores, set_threads
from mtkit.textio import atomic_file, write_file
from mtkit.training.batches import IdColumn, ParallelIds

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  benchmarks/speed.py measures mtkit's side

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / ".peers"
ONMT_SPEC = "OpenNMT-py==3.5.1"
TRAIN_BUDGET = "5m"  # the short mtkit run trained to decode with, when there is no trained run
# What onmt_train and onmt_translate import (found by trying): onmt/transforms/* are all imported at start-up.
ONMT_REQUIREMENTS = (
    "pyonmttok==1.38.1",
    "ConfigArgParse==1.9.0",
    "PyYAML==6.0.3",
    "numpy==2.4.6",
    "sacrebleu==2.6.0",
    "spacy==3.8.18",
    "pyahocorasick==2.3.1",
    "RapidFuzz==3.14.6",
    "regex==2026.11.15",
    "fasttext-wheel==0.9.2",
)
START_LINE = "Start training loop"
STEP_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO\] Step\s+(\d+)(?:/\s*\d+)?;.*?bsz:\s*([\d.]+)/\s*([\d.]+)/\s*([\d.]+);"
)
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


def onmt_env(threads: int) -> dict[str, str]:
    """OpenNMT-py's environment: its own virtualenv's packages only, old-style checkpoint loading, `threads` threads."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def setup_onmt(venv: Path, torch_spec: str) -> Path:
    """Install OpenNMT-py into `venv` unless its marker says it is there; returns the bin directory."""
    marker, wanted = venv / ".installed", "\n".join([torch_spec, ONMT_SPEC, *ONMT_REQUIREMENTS]) + "\n"
    if marker.is_file() and marker.read_text() == wanted:
        say(f"{ONMT_SPEC}: set up in {venv}")
        return venv / "bin"
    log = venv.parent / "onmt-setup.log"
    say(f"setting up {ONMT_SPEC} in {venv}, once (a few minutes; pip's output: {log})")
    venv.parent.mkdir(parents=True, exist_ok=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [*pip, torch_spec],  # first, so nothing else picks a torch
        [*pip, "--no-deps", ONMT_SPEC],  # its torch<2.3 pin is not installed
        [*pip, *ONMT_REQUIREMENTS],
    ]
    with log.open("w") as out:
        for command in steps:
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise MtkitError(f"setting up OpenNMT-py failed at `{' '.join(command)}`; see {log}")
    for tool in ("onmt_train", "onmt_translate"):
        check = subprocess.run([str(venv / "bin" / tool), "-h"], capture_output=True, text=True, env=onmt_env(1))
        if check.returncode != 0:
            raise MtkitError(f"{tool} does not start ({last_line(check.stderr)}); a requirement may be missing, see {log}")
    write_file(marker, wanted)
    return venv / "bin"


def say(message: str) -> None:
    """A progress line on stderr: standard output is left to the results."""
    print(f"peers: {message}", file=sys.stderr, flush=True)


def run_mtkit(arguments: list[str]) -> None:
    """An mtkit command, shown as a user would type it; its output (progress included) goes to stderr as it comes."""
    print("$ " + shlex.join(["mtkit", *arguments]), file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, "-m", "mtkit", *arguments], stdout=sys.stderr, check=False)
    if done.returncode != 0:
        raise MtkitError(f"`mtkit {shlex.join(arguments)}` failed (exit status {done.returncode}); see its output above")


def set_args(overrides: list[str]) -> list[str]:
    return [part for override in overrides for part in ("--set", override)]


def ensure_prepared(recipe: Path, overrides: list[str], config: Config) -> None:
    """`mtkit tokenizer train` and `mtkit prepare` for the recipe, where its data directory lacks their output."""
    data = config.data_path
    tokenizer_missing = not all(path.is_file() for path in tokenizer_files(data, config.tokenizer.joint))
    if tokenizer_missing:
        say(f"{data}: no tokenizer model yet; training it, then preparing the data")
        run_mtkit(["tokenizer", "train", str(recipe), *set_args(overrides)])
    if tokenizer_missing or not (data / REPORT_FILE).is_file():
        say(f"{data}: preparing the recipe's data (mtkit's pieces, the same for both toolkits)")
        run_mtkit(["prepare", str(recipe), *set_args(overrides)])
    else:
        say(f"{data}: tokenizer model and prepared data found")


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
    run_mtkit(["train", str(recipe), *set_args([*overrides, *settings])])


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return one_line(lines[-1] if lines else "no output", limit=200)


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


@dataclass
class OnmtTrainRun:
    """What run_onmt_train reports: the command, when its training loop started, its peak memory."""

    command: list[str]
    started: float  # epoch seconds
    peak_rss_mb: float | None  # onmt_train's own, its data-loader workers included; None when stopped at a budget


def run_onmt_train(bin_dir: Path, options: dict, run: Path, threads: int, budget: float | None) -> OnmtTrainRun:
    """onmt_train with `options` (written to run/train.yaml, its output to run/train.log), to its end or for `budget` seconds."""
    run.mkdir(parents=True, exist_ok=True)
    for old in [*run.glob("model_step_*.pt"), run / "train.log"]:
        old.unlink(missing_ok=True)
    write_file(run / "train.yaml", yaml.safe_dump(options, sort_keys=False))
    command = [str(bin_dir / "onmt_train"), "-config", str(run / "train.yaml")]
    log, peak = run / "train.log", None
    with log.open("w") as out:  # written by onmt_train as it goes, and read here meanwhile
        # A session of its own: stopping it stops its data-loader workers too.
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=onmt_env(threads), start_new_session=True)
        try:
            started = wait_for_start(process, log)
            if budget is None:
                peak = wait_with_peak_rss(process)
            else:
                stop_at(process, started + budget)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    if budget is None and process.returncode != 0:
        raise MtkitError(f"onmt_train failed ({last_line(log.read_text(errors='replace'))}); see {log}")
    return OnmtTrainRun(command, started, peak)


def wait_with_peak_rss(process: subprocess.Popen) -> float:
    """Wait for `process` to end; its peak resident memory in MB, its own children's included once it reaped them.

    Measured for this process alone (wait4), not for every child so far: the mtkit commands run
    before it (tokenizer training, prepare, a short training run) may have used more.
    """
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024  # Linux reports KiB


def wait_for_start(process: subprocess.Popen, log: Path) -> float:
    """When onmt_train's log says its training loop starts; a one-line error if it ends before."""
    while START_LINE not in log.read_text(errors="replace"):
        if process.poll() is not None:
            raise MtkitError(f"onmt_train stopped before training ({last_line(log.read_text(errors='replace'))}); see {log}")
        time.sleep(0.2)
    return time.time()


def stop_at(process: subprocess.Popen, deadline: float) -> None:
    """Let the process run until `deadline` (epoch seconds), then stop its process group."""
    while process.poll() is None and time.time() < deadline:
        time.sleep(min(1.0, max(deadline - time.time(), 0.01)))
    if process.poll() is not None:
        raise MtkitError(f"onmt_train ended before the budget (exit status {process.returncode}); see its train.log")
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def onmt_window(log: Path, first: int, last: int, batches_per_report: int) -> dict:
    """Target tokens/s of updates first+1..last from onmt_train's report lines (`batches_per_report` batches each)."""
    stamps, target, source, sentences = {}, 0.0, 0.0, 0.0
    for line in log.read_text(errors="replace").splitlines():
        match = STEP_LINE.match(line)
        if not match:
            continue
        step = int(match[2])
        stamps[step] = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if first < step <= last:
            source += float(match[3]) * batches_per_report
            target += float(match[4]) * batches_per_report
            sentences += float(match[5]) * batches_per_report
    if first not in stamps or last not in stamps:
        raise MtkitError(f"{log}: no report lines for steps {first} and {last}; see the log")
    seconds, updates = stamps[last] - stamps[first], last - first
    return {
        "updates": updates,
        "target_tokens_per_update": round(target / updates, 1),
        "source_tokens_per_update": round(source / updates, 1),
        "sentences_per_update": round(sentences / updates, 1),
        "target_tokens_per_s": round(target / seconds, 1),
        "seconds": round(seconds, 2),
    }


def onmt_parameters(log: Path) -> int | None:
    match = re.search(r"number of parameters: (\d+)", log.read_text(errors="replace"))
    return int(match[1]) if match else None


def onmt_training(
    bin_dir: Path, config: Config, data: PieceData, run: Path, window: tuple[int, int], threads: int, extra: dict
) -> dict:
    """OpenNMT-py's training speed over updates warmup+1..warmup+updates (it then saves its only checkpoint)."""
    (warmup, updates), steps = window, sum(window)
    report_every = math.gcd(warmup, updates)
    options = onmt_options(config, data, run, steps, report_every, steps, extra)
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


def shell_line(command: list[str]) -> str:
    """The command as it was run, with the environment it needed."""
    return "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 " + " ".join(command)


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


def onmt_decoding(bin_dir: Path, config: Config, data: PieceData, model: Path, max_len: int, threads: int) -> dict:
    """onmt_translate at beam 5 and greedy on the test sources: speed by its own clock, BLEU by mtkit's scoring."""
    results: dict = {"model": str(model), "commands": []}
    for name, beam in (("beam5", 5), ("greedy", 1)):
        output = data.path(f"test.{name}.onmt")
        command = translate_command(bin_dir, config, model, data.path("test.src"), output, beam, max_len)
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


def onmt_translation_seconds(output: str, words: int) -> float:
    """The seconds of translation onmt_translate reports: its tokens/s figure is the finer when there are tokens."""
    rate = re.search(r"Tokens per second: ([\d.]+)", output)
    if words and rate and float(rate[1]) > 0:
        return words / float(rate[1])
    total = re.search(r"Total translation time \(s\): ([\d.]+)", output)
    if not total:
        raise MtkitError(f"onmt_translate printed no translation time ({last_line(output)})")
    return max(float(total[1]), 0.05)


def mtkit_decoding(config: Config, model: Path, max_len: int) -> dict:
    """speed.py's decoding of the test split, with the recipe's decode settings and the fixed output cap."""
    from mtkit.decoding.translator import Translator

    translator = Translator.load(model, device="cpu")
    translator.decode = dataclasses.replace(config.decode, max_len_a=0.0, max_len_b=max_len)
    return {"model": str(model), **speed.decode_split(config, translator)}


def newest_loading_checkpoint(bin_dir: Path, run: Path, threads: int) -> Path:
    """The newest model_step_*.pt that loads (one being written when the budget ran out does not)."""
    checkpoints = sorted(run.glob("model_step_*.pt"), key=lambda path: int(path.stem.rsplit("_", 1)[1]), reverse=True)
    probe = "import sys, torch; torch.load(sys.argv[1], map_location='cpu')"
    for path in checkpoints:
        if (
            subprocess.run(
                [str(bin_dir / "python"), "-c", probe, str(path)], env=onmt_env(threads), capture_output=True
            ).returncode
            == 0
        ):
            return path
    raise MtkitError(f"{run}: no checkpoint was written within the budget; give a longer --budget or a smaller --save-every")


def machine(bin_dir: Path) -> dict:
    import torch

    probe = "import importlib.metadata as m, torch; print(torch.__version__, m.version('OpenNMT-py'))"
    versions = subprocess.run([str(bin_dir / "python"), "-c", probe], capture_output=True, text=True, env=onmt_env(1))
    onmt_torch, onmt_version = (versions.stdout.split() + ["?", "?"])[:2]
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
    """Training, then decoding (mtkit's `model`), each as mtkit, OpenNMT-py, mtkit; the fp32 matmul peak before and after."""
    say("measuring the fp32 matmul peak")
    report: dict = {"matmul_gflop_per_s": {"start": round(speed.matmul_flops_per_s() / 1e9, 1)}}
    window = f"updates {args.warmup_updates + 1}-{args.warmup_updates + args.updates}"
    say(f"training speed 1/3: mtkit, {window}")
    runs = [{"toolkit": "mtkit", "measure": "training", **speed.benchmark_training(config, args.warmup_updates, args.updates)}]
    run_dir = PEERS_DIR / "runs" / f"{config.name}-speed"
    say(f"training speed 2/3: OpenNMT-py, {window} (its log: {run_dir / 'train.log'})")
    onmt = onmt_training(bin_dir, config, data, run_dir, (args.warmup_updates, args.updates), threads, args.onmt_options)
    runs.append({"toolkit": "OpenNMT-py", "measure": "training", **onmt})
    say(f"training speed 3/3: mtkit, {window}")
    runs.append(
        {"toolkit": "mtkit", "measure": "training", **speed.benchmark_training(config, args.warmup_updates, args.updates)}
    )
    onmt_model = args.onmt_model or Path(onmt["checkpoint"])
    searches = f"beam 5 and greedy on {len(data.references)} test sentences"
    say(f"decoding speed 1/3: mtkit, {searches} ({model})")
    runs.append({"toolkit": "mtkit", "measure": "decoding", **mtkit_decoding(config, model, args.max_len)})
    say(f"decoding speed 2/3: OpenNMT-py, {searches} ({onmt_model})")
    onmt_decode = onmt_decoding(bin_dir, config, data, onmt_model, args.max_len, threads)
    runs.append({"toolkit": "OpenNMT-py", "measure": "decoding", **onmt_decode})
    say(f"decoding speed 3/3: mtkit, {searches}")
    runs.append({"toolkit": "mtkit", "measure": "decoding", **mtkit_decoding(config, model, args.max_len)})
    report["matmul_gflop_per_s"]["end"] = round(speed.matmul_flops_per_s() / 1e9, 1)
    report["runs"] = runs
    report["ratios"] = ratios(runs)
    report["onmt_commands"] = [onmt["command"], *onmt_decode["commands"]]
    return report


def budget_report(args: argparse.Namespace, config: Config, bin_dir: Path, data: PieceData, threads: int) -> dict:
    """OpenNMT-py trained for the budget with the recipe's settings, its test BLEU, and mtkit's snapshot of that time."""
    budget = parse_duration(args.budget) or 0.0
    run_dir = PEERS_DIR / "runs" / f"{config.name}-budget-{args.budget}"
    options = onmt_options(config, data, run_dir, 10_000_000, config.train.log_every, args.save_every, args.onmt_options)
    say(f"training OpenNMT-py for {args.budget} (its log: {run_dir / 'train.log'})")
    trained = run_onmt_train(bin_dir, options, run_dir, threads, budget)
    checkpoint = newest_loading_checkpoint(bin_dir, run_dir, threads)
    say(f"decoding the test split with OpenNMT-py's {checkpoint}, beam 5 and greedy")
    onmt = {
        "toolkit": "OpenNMT-py",
        "updates": int(checkpoint.stem.rsplit("_", 1)[1]),
        "checkpoint_written_after_s": round(checkpoint.stat().st_mtime - trained.started, 1),
        "parameters": onmt_parameters(run_dir / "train.log"),
        "command": shell_line(trained.command),
        "options": options,
        "decode": onmt_decoding(bin_dir, config, data, checkpoint, args.max_len, threads),
    }
    report: dict = {"budget": args.budget, "budget_s": budget, "runs": [onmt]}
    snapshot = (args.model or config.run_path) / f"at_{args.budget}.pt"
    if not snapshot.is_file() and args.model is not None:
        snapshot = args.model  # a run trained for the budget (train.max_time) is its own snapshot
    if snapshot.exists():
        say(f"decoding the test split with mtkit's {snapshot}, beam 5 and greedy")
        decode = mtkit_decoding(config, snapshot, args.max_len)
        report["runs"].append({"toolkit": "mtkit", "decode": decode})
    else:
        say(f"no mtkit snapshot {snapshot} (train.snapshots, or --model RUN trained for {args.budget}): OpenNMT-py's BLEU only")
    report["onmt_commands"] = [onmt["command"], *onmt["decode"]["commands"]]
    return report


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
        ratio = f"{report['ratios'][ratio_key]:>8.2f}x" if ratio_key else ""
        print(f"{label:34}" + "".join(f"{figure(run, key):>13.1f}" for run in group) + ratio)
    peaks = report["matmul_gflop_per_s"]
    print(f"fp32 matmul peak: {peaks['start']:.0f} GFLOP/s at the start, {peaks['end']:.0f} at the end")
    for run in decoding:
        sentences = run["sentences"]
        lengths = [run[s]["target_pieces_per_s"] / run[s]["sentences_per_s"] for s in ("beam5", "greedy")]
        print(f"{run['toolkit']} decoded {run['model']}: {lengths[0]:.1f} / {lengths[1]:.1f} pieces a sentence ({sentences})")


def print_budget(report: dict) -> None:
    onmt = report["runs"][0]
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


def main() -> None:
    args = parse_args()
    try:
        config = load_config(args.recipe, args.overrides)
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, device="cpu"))  # both on CPU
        check_inputs(args, config)
        threads = config.train.threads or cpu_cores()
        set_threads(threads)
        ensure_prepared(args.recipe, args.overrides, config)
        bin_dir = setup_onmt(PEERS_DIR / "onmt-venv", args.torch_spec)
        model = None if args.budget else decoding_model(args, config)
        say(f"writing mtkit's pieces and vocabulary for OpenNMT-py to {PEERS_DIR / 'data' / config.name}")
        data = write_piece_data(config, PEERS_DIR / "data" / config.name)
        report = {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "recipe": str(args.recipe),
            "overrides": args.overrides,
            "machine": machine(bin_dir),
            "counts": COUNTS,
            "not_matched": differences(config),
        }
        if model is None:
            report.update(budget_report(args, config, bin_dir, data, threads))
        else:
            report.update(speed_report(args, config, bin_dir, data, threads, model))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        write_file(args.output, json.dumps(report, indent=1) + "\n")
    except MtkitError as err:
        sys.exit(f"peers: error: {err}")
    (print_budget if args.budget else print_speed)(report)
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
