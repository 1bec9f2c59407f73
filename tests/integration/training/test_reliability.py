"""Training never loses work: locks, divergence, rotation, Ctrl-C, kill -9 and exact resume."""

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

import mtkit.training.loss
import mtkit.training.run_writer
import mtkit.training.trainer
from mtkit.config import config_to_dict
from mtkit.errors import MtkitError
from mtkit.models.checkpoint import read_checkpoint
from mtkit.training.run_writer import RunWriter, lock_run_dir
from mtkit.training.trainer import Trainer, setup_process, train

REPO = Path(__file__).resolve().parents[2]


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
def test_non_finite_losses_are_skipped_and_counted(tmp_path, monkeypatch):
    config = prepared_reverse_task(tmp_path, max_steps=20, validate_every=20)
    real_loss, calls = mtkit.training.loss.sequence_loss, {"n": 0}

    def sometimes_nan(logits, target, smoothing):
        calls["n"] += 1
        loss = real_loss(logits, target, smoothing)
        return loss * float("nan") if calls["n"] in (3, 4) else loss

    monkeypatch.setattr(mtkit.training.loss, "sequence_loss", sometimes_nan)
    progress = train(config)
    assert progress.step == 20
    assert progress.skipped_updates == 2
    for value in read_checkpoint(config.run_path / "last.pt")["model"].values():
        assert torch.isfinite(value.float()).all()


@pytest.mark.slow
def test_repeated_non_finite_losses_stop_training_and_keep_best(tmp_path, monkeypatch):
    config = prepared_reverse_task(tmp_path, max_steps=10, validate_every=10)
    train(config)
    best_before = (config.run_path / "best.pt").read_bytes()
    monkeypatch.setattr(mtkit.training.loss, "sequence_loss", lambda logits, target, smoothing: logits.sum() * float("inf"))
    config.train.max_steps = 100
    with pytest.raises(MtkitError, match="diverged"):
        train(config, resume=True)
    assert (config.run_path / "best.pt").read_bytes() == best_before
    assert read_checkpoint(config.run_path / "last.pt")["progress"]["skipped_updates"] == config.train.max_nonfinite


@pytest.mark.slow
def test_fp16_gradient_overflow_skips_the_update_says_so_and_lowers_the_loss_scale(tmp_path, monkeypatch, capsys):
    # The fp16 path, run on CPU: fp16 autocast and a gradient scaler whose first scale is far too high.
    real_scaler = torch.amp.GradScaler
    monkeypatch.setattr(mtkit.training.trainer, "autocast_dtype", lambda device, precision: torch.float16)
    monkeypatch.setattr(torch.amp, "GradScaler", lambda device, enabled: real_scaler(device, 2.0**30, enabled=enabled))
    config = prepared_reverse_task(tmp_path, max_steps=20, validate_every=20)
    config.train.max_nonfinite = 40
    distributed, device = setup_process(config.train)
    trainer = Trainer(config, device, distributed, RunWriter(config.run_path))
    assert trainer.scaler.is_enabled()
    progress = trainer.run()

    assert progress.step == 20 and trainer.scheduler.last_epoch == 20  # skipped updates do not count
    records = [json.loads(line) for line in (config.run_path / "log.jsonl").read_text().splitlines()]
    overflows = [r for r in records if r.get("overflow")]
    assert len(overflows) == progress.skipped_updates >= 1
    scales = [r["loss_scale"] for r in overflows]
    assert scales[0] == 2.0**29 and all(later == earlier / 2 for earlier, later in zip(scales, scales[1:], strict=False))
    assert f"fp16: gradient overflow at update 1; update skipped, loss scale lowered to {2.0**29:g}" in capsys.readouterr().err
    last = read_checkpoint(config.run_path / "last.pt")
    assert last["scaler"]["scale"] == trainer.scaler.get_scale() <= scales[-1]
    for value in last["model"].values():
        assert torch.isfinite(value.float()).all()


@pytest.mark.slow
def test_keep_rotates_step_checkpoints(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=25, validate_every=5, keep=2)
    train(config)
    assert sorted(p.name for p in config.run_path.glob("step_*.pt")) == ["step_00000020.pt", "step_00000025.pt"]
    assert read_checkpoint(config.run_path / "step_00000020.pt")["step"] == 20


@pytest.mark.slow
def test_same_seed_gives_the_same_model(tmp_path):
    first = prepared_reverse_task(tmp_path / "a", max_steps=15, validate_every=15)
    second = prepared_reverse_task(tmp_path / "b", max_steps=15, validate_every=15)
    first.model.dropout = second.model.dropout = 0.1
    train(first)
    train(second)
    a, b = (read_checkpoint(c.run_path / "last.pt")["model"] for c in (first, second))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


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
def test_kill_9_then_resume_ends_like_an_uninterrupted_run(tmp_path, request, fine_tuning):
    settings = {"max_steps": 150, "validate_every": 10, "log_every": 5, "batch_tokens": 300}
    if fine_tuning:  # a fine-tuning run resumes exactly too (its step-0 validation is not repeated)
        settings["init_from"] = str(request.getfixturevalue("reverse_run").run_path)
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


@pytest.mark.slow
def test_resume_refuses_when_another_training_holds_the_run(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=5, validate_every=5)
    train(config)
    held = lock_run_dir(config.run_path)
    try:
        with pytest.raises(MtkitError, match="another training"):
            train(config, resume=True)
    finally:
        held.close()


@pytest.mark.slow
def test_a_full_disk_during_training_is_reported_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    config = prepared_reverse_task(tmp_path, max_steps=10, validate_every=10)
    train(config)
    before = (config.run_path / "last.pt").read_bytes()

    def disk_full(payload, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mtkit.training.run_writer, "save_checkpoint", disk_full)
    config.train.max_steps = 20
    with pytest.raises(MtkitError, match="No space left on device.*previous checkpoints are intact"):
        train(config, resume=True)
    assert (config.run_path / "last.pt").read_bytes() == before
