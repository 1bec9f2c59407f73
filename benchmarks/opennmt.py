"""OpenNMT-py 3.5.1 for benchmarks/peers.py: set up in a virtualenv of its own, found there, and its
commands run and read (onmt_train's report lines, onmt_translate's clock, its checkpoints).

OpenNMT-py pins torch<2.3, so it is installed with --no-deps beside the torch that mtkit uses, and
then only the packages its commands import. torch >= 2.6 loads checkpoints with weights_only=True,
which OpenNMT-py's own checkpoints fail, so its commands run with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from mtkit.errors import MtkitError, one_line
from mtkit.textio import write_file

ONMT_SPEC = "OpenNMT-py==3.5.1"
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


def say(message: str) -> None:
    """A progress line on stderr: standard output is left to the results."""
    print(f"peers: {message}", file=sys.stderr, flush=True)


def onmt_env(threads: int) -> dict[str, str]:
    """OpenNMT-py's environment: its own virtualenv's packages only, old-style checkpoint loading, `threads` threads."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def installed_onmt(venv: Path, torch_spec: str) -> Path | None:
    """The bin directory of OpenNMT-py in `venv` when its marker says it is set up with these packages, else None."""
    marker = venv / ".installed"
    if marker.is_file() and marker.read_text() == "\n".join([torch_spec, ONMT_SPEC, *ONMT_REQUIREMENTS]) + "\n":
        return venv / "bin"
    return None


def setup_onmt(venv: Path, torch_spec: str) -> Path:
    """Install OpenNMT-py into `venv` unless its marker says it is there; returns the bin directory."""
    found = installed_onmt(venv, torch_spec)
    if found is not None:
        say(f"{ONMT_SPEC}: set up in {venv}")
        return found
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
    write_file(venv / ".installed", "\n".join([torch_spec, ONMT_SPEC, *ONMT_REQUIREMENTS]) + "\n")
    return venv / "bin"


def onmt_versions(bin_dir: Path) -> tuple[str, str]:
    """The torch and OpenNMT-py versions of OpenNMT-py's virtualenv ("?" where it does not say)."""
    probe = "import importlib.metadata as m, torch; print(torch.__version__, m.version('OpenNMT-py'))"
    versions = subprocess.run([str(bin_dir / "python"), "-c", probe], capture_output=True, text=True, env=onmt_env(1))
    onmt_torch, onmt_version = (versions.stdout.split() + ["?", "?"])[:2]
    return onmt_torch, onmt_version


def train_command(bin_dir: Path, run: Path) -> list[str]:
    """onmt_train reading the options that `run_onmt_train` writes to run/train.yaml."""
    return [str(bin_dir / "onmt_train"), "-config", str(run / "train.yaml")]


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return one_line(lines[-1] if lines else "no output", limit=200)


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
    command = train_command(bin_dir, run)
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


def onmt_translation_seconds(output: str, words: int) -> float:
    """The seconds of translation onmt_translate reports: its tokens/s figure is the finer when there are tokens."""
    rate = re.search(r"Tokens per second: ([\d.]+)", output)
    if words and rate and float(rate[1]) > 0:
        return words / float(rate[1])
    total = re.search(r"Total translation time \(s\): ([\d.]+)", output)
    if not total:
        raise MtkitError(f"onmt_translate printed no translation time ({last_line(output)})")
    return max(float(total[1]), 0.05)


def shell_line(command: list[str]) -> str:
    """The command as it was run, with the environment it needed."""
    return "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 " + " ".join(command)
