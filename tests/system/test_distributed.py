"""torchrun on CPU (gloo): two training processes equal one over the combined batch; two translating processes equal one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import invoke, prepared_reverse_task, succeeded, torchrun_mtkit

from mtkit.config import config_to_dict
from mtkit.models.checkpoint import read_checkpoint
from mtkit.training.trainer import train

REPO = Path(__file__).resolve().parents[2]


def torchrun(recipe: Path, processes: int, *arguments: str) -> list[str]:
    return torchrun_mtkit(processes, "train", str(recipe), *arguments)


def write_recipe(config, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config_to_dict(config)))
    return path


def first_loss(run: Path) -> float:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return next(r["train_loss"] for r in records if r.get("step") == 1 and "train_loss" in r)


@pytest.mark.slow
def test_two_processes_equal_one_process_over_the_combined_batch(tmp_path):
    settings = {"max_steps": 1, "validate_every": 1, "log_every": 1, "batch_tokens": 300, "label_smoothing": 0.1}
    single = prepared_reverse_task(tmp_path / "single", accumulate=2, **settings)
    double = prepared_reverse_task(tmp_path / "double", accumulate=1, **settings)
    for config in (single, double):
        config.model.dropout = 0.0
    train(single)  # the one process: here (a process of its own would only add its start)
    result = subprocess.run(torchrun(write_recipe(double, tmp_path / "double.yaml"), 2), cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]

    assert first_loss(double.run_path) == pytest.approx(first_loss(single.run_path), abs=1e-4)
    one, two = (read_checkpoint(c.run_path / "last.pt")["model"] for c in (single, double))
    for name, value in one.items():
        torch.testing.assert_close(two[name], value, rtol=1e-5, atol=1e-6, msg=name)
    # One set of outputs: every log line once, one checkpoint set, status printed once.
    lines = (double.run_path / "log.jsonl").read_text().splitlines()
    assert len(lines) == len(set(lines)) == 3  # the epoch's corpus draw, one loss window, one validation
    assert sorted(p.name for p in double.run_path.glob("*.pt")) == ["best.pt", "last.pt"]
    assert result.stderr.count("training finished") == 1


@pytest.mark.slow
def test_killing_one_rank_ends_the_whole_job(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=1_000_000, validate_every=1_000_000, log_every=5)
    recipe = write_recipe(config, tmp_path / "recipe.yaml")
    job = subprocess.Popen(
        torchrun(recipe, 2), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    log = config.run_path / "log.jsonl"
    deadline = time.monotonic() + 120
    while not (log.is_file() and log.read_text().count("train_loss") >= 2):
        assert time.monotonic() < deadline and job.poll() is None, "the job did not start training"
        time.sleep(0.1)
    workers = subprocess.run(["pgrep", "-f", "-P", str(job.pid), "mtkit"], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2, workers
    killed_at = time.monotonic()
    os.kill(int(workers[1]), signal.SIGKILL)
    try:
        _, stderr = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode != 0
    assert time.monotonic() - killed_at < 30
    assert "Signal 9" in stderr or "SIGKILL" in stderr or "failed" in stderr.lower()


@pytest.mark.slow
def test_resume_under_torchrun_matches_a_straight_run(tmp_path):
    settings = {"validate_every": 2, "log_every": 1, "batch_tokens": 300}
    straight = prepared_reverse_task(tmp_path / "straight", max_steps=6, **settings)
    resumed = prepared_reverse_task(tmp_path / "resumed", max_steps=3, **settings)
    run = subprocess.run(
        torchrun(write_recipe(straight, tmp_path / "straight.yaml"), 2), cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    recipe = write_recipe(resumed, tmp_path / "resumed.yaml")
    first = subprocess.run(torchrun(recipe, 2), cwd=REPO, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run(
        torchrun(recipe, 2, "--resume", "--set", "train.max_steps=6"), cwd=REPO, capture_output=True, text=True
    )
    assert second.returncode == 0, second.stderr[-2000:]
    a, b = (read_checkpoint(c.run_path / "last.pt") for c in (straight, resumed))
    assert a["step"] == b["step"] == 6
    for name, value in a["model"].items():
        torch.testing.assert_close(b["model"][name], value, rtol=0, atol=0, msg=name)


# One rank of a job whose clocks disagree, as real ones do by a little: rank r's clock runs 0.37 s per rank ahead.
SKEWED_CLOCK_RANK = """
import sys
import torch
from mtkit.config import load_config
from mtkit.distributed import shutdown
from mtkit.training.trainer import Trainer, setup_process

config = load_config(sys.argv[1])
distributed, device = setup_process(config.train)
Trainer.elapsed = lambda self: float(self.progress.step) + 0.37 * self.distributed.rank
trainer = Trainer(config, device, distributed=distributed)
trainer.run()
state = {"model": trainer.model.state_dict(), "lr": trainer.scheduler.get_last_lr()[0], "step": trainer.progress.step}
torch.save(state, f"{sys.argv[2]}/rank{distributed.rank}.pt")
shutdown(distributed)
"""


def run_two_ranks(script_text: str, config, tmp_path: Path) -> tuple[dict, dict]:
    """Run a rank script (its arguments: the recipe and the folder for rank<r>.pt) as a two-process torchrun job;
    what each rank saved."""
    script = tmp_path / "rank.py"
    script.write_text(script_text)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    result = subprocess.run(
        [*command, str(write_recipe(config, tmp_path / "recipe.yaml")), str(tmp_path)], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")


@pytest.mark.slow
def test_a_time_based_decay_gives_every_rank_the_same_learning_rate(tmp_path):
    settings = {"schedule": "linear", "min_lr": 0.0, "warmup_steps": 1, "max_steps": 0, "max_time": "8s", "batch_tokens": 300}
    config = prepared_reverse_task(tmp_path, validate_every=1000, **settings)
    first, second = run_two_ranks(SKEWED_CLOCK_RANK, config, tmp_path)
    assert first["step"] == second["step"] == 8  # rank 1's clock reads 8.37 s after update 8
    # After update 8 the schedule reads the clocks of the last stop check, before it: the larger says 7.37 s.
    assert first["lr"] == second["lr"] == pytest.approx(config.train.lr * (1 - 7.37 / 8))
    for name, value in first["model"].items():
        assert torch.equal(second["model"][name], value), name


# One rank of a job where only rank 1 is signalled to stop, as its update 5 ends (its SIGTERM handler's flag).
SIGNALLED_RANK = """
import sys
import torch
from mtkit.config import load_config
from mtkit.distributed import shutdown
from mtkit.training.trainer import Trainer, setup_process

config = load_config(sys.argv[1])
distributed, device = setup_process(config.train)
trainer = Trainer(config, device, distributed=distributed)
update = trainer.update

def update_then_signal(*args, **kwargs):
    result = update(*args, **kwargs)
    if distributed.rank == 1 and trainer.progress.step == 5:
        trainer.stop_requested = True
    return result

trainer.update = update_then_signal
trainer.run()
torch.save({"model": trainer.model.state_dict(), "step": trainer.progress.step}, f"{sys.argv[2]}/rank{distributed.rank}.pt")
shutdown(distributed)
"""


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_update(tmp_path):
    settings = {"max_steps": 1000, "batch_tokens": 300}
    config = prepared_reverse_task(tmp_path, validate_every=1000, **settings)
    first, second = run_two_ranks(SIGNALLED_RANK, config, tmp_path)
    # Without train.max_time the ranks never wait for each other: the vote sent after update 5 is read after update 6.
    assert first["step"] == second["step"] == 6
    for name, value in first["model"].items():
        assert torch.equal(second["model"][name], value), name


def test_two_processes_translate_a_file_exactly_as_one(reverse_run, tmp_path):
    lines = Path(reverse_run.data.valid[0].src).read_text().splitlines()[:45]
    lines[10:10] = ["", "a b c d e f g h i j k l " * 3, "a b c. d e f!  g h"]  # an empty line, a long one, a paragraph
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    arguments = ["translate", "-m", str(reverse_run.run_path), "-i", str(source), "--buffer-lines", "7", "--nbest", "2"]
    succeeded(invoke(*arguments, "-o", tmp_path / "one.txt"))  # the one process: here
    two = subprocess.run(torchrun_mtkit(2, *arguments, "-o", str(tmp_path / "two.txt")), cwd=REPO, capture_output=True, text=True)
    assert two.returncode == 0, two.stderr[-2000:]
    expected = (tmp_path / "one.txt").read_text(encoding="utf-8")
    assert len(expected.splitlines()) == len(lines)
    assert (tmp_path / "two.txt").read_text(encoding="utf-8") == expected
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.txt", "one.txt", "two.txt"]  # no temporary file left


def test_translation_under_torchrun_needs_an_input_file(reverse_run):
    result = subprocess.run(
        torchrun_mtkit(2, "translate", "-m", str(reverse_run.run_path)),
        cwd=REPO,
        input="a b c\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    message = "mtkit: error: under torchrun every process reads the input itself: give it as a file with -i FILE"
    assert message in result.stderr.splitlines()
