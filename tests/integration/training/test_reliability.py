"""Training never loses work: locks, divergence, fp16 overflow, rotation, a full disk and the same seed
(Ctrl-C and kill -9 on a training process: tests/system/training/)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import prepared_reverse_task

import mtkit.training.loss
import mtkit.training.run_writer
import mtkit.training.trainer
from mtkit.errors import MtkitError
from mtkit.models.checkpoint import read_checkpoint
from mtkit.training.run_writer import RunWriter, lock_run_dir
from mtkit.training.trainer import Trainer, setup_process, train


@pytest.mark.slow
def test_non_finite_losses_are_skipped_and_counted(tmp_path, monkeypatch):
    config = prepared_reverse_task(tmp_path, max_steps=20, validate_every=20)
    real_loss, calls = mtkit.training.loss.sequence_loss, {"n": 0}

    def sometimes_nan(logits, target, *, label_smoothing):
        calls["n"] += 1
        loss = real_loss(logits, target, label_smoothing=label_smoothing)
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

    def infinite(logits, target, *, label_smoothing):
        return logits.sum() * float("inf")

    monkeypatch.setattr(mtkit.training.loss, "sequence_loss", infinite)
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
    # 2**20 overflows the tiny model's fp16 gradients for its first few updates, then the halved scale fits
    monkeypatch.setattr(torch.amp, "GradScaler", lambda device, enabled: real_scaler(device, 2.0**20, enabled=enabled))
    config = prepared_reverse_task(tmp_path, max_steps=5, validate_every=5)
    config.train.max_nonfinite = 40
    distributed, device = setup_process(config.train)
    trainer = Trainer(config, device, distributed=distributed, run_dir=RunWriter(config.run_path))
    assert trainer.scaler.is_enabled()
    progress = trainer.run()

    assert progress.step == 5 and trainer.scheduler.last_epoch == 5  # skipped updates do not count
    records = [json.loads(line) for line in (config.run_path / "log.jsonl").read_text().splitlines()]
    overflows = [r for r in records if r.get("overflow")]
    assert len(overflows) == progress.skipped_updates >= 1
    scales = [r["loss_scale"] for r in overflows]
    assert scales[0] == 2.0**19 and all(later == earlier / 2 for earlier, later in zip(scales, scales[1:], strict=False))
    assert f"fp16: gradient overflow at update 1; update skipped, loss scale lowered to {2.0**19:g}" in capsys.readouterr().err
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
