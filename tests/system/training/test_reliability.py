"""Training in a child process never loses work: Ctrl-C saves the last checkpoint and says how to resume,
and kill -9 then resume ends like an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import prepared_reverse_task

from mtkit.config import config_to_dict
from mtkit.models.checkpoint import read_checkpoint
from mtkit.training.trainer import train

REPO = Path(__file__).resolve().parents[3]


def write_recipe(config, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config_to_dict(config)))
    return path


def start_training(recipe: Path, *arguments: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mtkit", "train", str(recipe), *arguments],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the training process"
        time.sleep(0.05)


@pytest.mark.slow
def test_ctrl_c_saves_last_and_says_how_to_resume(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=100_000, validate_every=100_000, log_every=5)
    recipe = write_recipe(config, tmp_path / "recipe.yaml")
    process = start_training(recipe)
    log = config.run_path / "log.jsonl"
    wait_for(lambda: log.is_file() and log.read_text().count("train_loss") >= 2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "--resume" in stderr
    stopped_at = read_checkpoint(config.run_path / "last.pt")["step"]
    assert 10 <= stopped_at < 100_000
    resumed = start_training(recipe, "--resume", "--set", f"train.max_steps={stopped_at + 5}")
    _, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr
    assert read_checkpoint(config.run_path / "last.pt")["step"] == stopped_at + 5


@pytest.mark.slow
@pytest.mark.parametrize("fine_tuning", [False, True], ids=["from-scratch", "fine-tuning"])
def test_kill_9_then_resume_ends_like_an_uninterrupted_run(tmp_path, fine_tuning):
    settings = {"max_steps": 150, "validate_every": 10, "log_every": 5, "batch_tokens": 300}
    if fine_tuning:  # a fine-tuning run resumes exactly too (its step-0 validation is not repeated)
        parent = prepared_reverse_task(tmp_path / "parent", max_steps=20, validate_every=20, batch_tokens=300)
        train(parent)
        settings["init_from"] = str(parent.run_path)
    straight = prepared_reverse_task(tmp_path / "straight", **settings)
    train(straight)

    killed = prepared_reverse_task(tmp_path / "killed", **settings)
    recipe = write_recipe(killed, tmp_path / "recipe.yaml")
    process = start_training(recipe)
    wait_for(lambda: (killed.run_path / "last.pt").is_file())
    time.sleep(random.uniform(0.0, 1.0))  # a random moment, possibly in the middle of a checkpoint write
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL  # it was killed, not finished
    assert read_checkpoint(killed.run_path / "last.pt")["step"] < 150  # the last checkpoint is still readable
    resumed = start_training(recipe, "--resume")
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr

    final_straight = read_checkpoint(straight.run_path / "last.pt")
    final_resumed = read_checkpoint(killed.run_path / "last.pt")
    assert final_resumed["step"] == final_straight["step"] == 150
    for name, value in final_straight["model"].items():
        torch.testing.assert_close(final_resumed["model"][name], value, rtol=0, atol=0, msg=name)

    def last_loss(config) -> float:
        lines = (config.run_path / "log.jsonl").read_text().splitlines()
        return [r["train_loss"] for r in map(json.loads, lines) if r.get("step") == 150 and "train_loss" in r][-1]

    assert last_loss(killed) == last_loss(straight)
