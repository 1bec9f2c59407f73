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
import sys
from pathlib import Path

import yaml

from benchmarks import common
from benchmarks.common import MtkitCommands, set_args
from benchmarks.onmt_config import differences, write_piece_data
from benchmarks.opennmt import installed_onmt, say, setup_onmt
from benchmarks.peers_measure import COUNTS, budget_report, machine, print_budget, print_speed, speed_report
from mtkit.config import Config, load_config, parse_duration
from mtkit.errors import MtkitError
from mtkit.runtime import cpu_cores, set_threads

PEERS_DIR = common.ROOT / ".peers"
TRAIN_BUDGET = "5m"  # the short mtkit run trained to decode with, when there is no trained run


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
