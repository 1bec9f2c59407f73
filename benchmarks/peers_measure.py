"""benchmarks/peers.py's measurements and report: training and decoding speed in the order mtkit, OpenNMT-py,
mtkit, or OpenNMT-py's BLEU after a time budget beside mtkit's snapshot of that time, the ratios, and the
printed tables."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import subprocess
from pathlib import Path

import yaml

from benchmarks import common, speed
from benchmarks.onmt_config import PieceData, detokenise, onmt_options, translate_command
from benchmarks.opennmt import (
    last_line,
    newest_loading_checkpoint,
    onmt_env,
    onmt_parameters,
    onmt_translation_seconds,
    onmt_versions,
    onmt_window,
    run_onmt_train,
    say,
    shell_line,
    train_command,
)
from mtkit.config import Config, parse_duration
from mtkit.errors import MtkitError
from mtkit.evaluation.metrics import score_corpus
from mtkit.runtime import cpu_cores
from mtkit.textio import write_file

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
