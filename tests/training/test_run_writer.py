"""RunWriter, a training's hold on its run directory: the lock, refuse / overwrite / resume, checkpoints, the log."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import yaml

import mtkit.training.run_writer
from mtkit.config import config_from_dict
from mtkit.errors import MtkitError
from mtkit.models.checkpoint import read_checkpoint
from mtkit.training.run_writer import Checkpoint, RunWriter, lock_run_dir

RUN_FILES = ["average.pt", "best.pt", "ema.pt", "last.pt", "log.jsonl", "step_00000010.pt"]


def checkpoint(step: int, ema: bool = False) -> Checkpoint:
    tokenizers = SimpleNamespace(
        src=SimpleNamespace(model_proto=b"src", table=None), tgt=SimpleNamespace(model_proto=b"tgt", table=None)
    )
    weights = {"weight": torch.full((2,), float(step))}
    return Checkpoint(
        config=config_from_dict({}),
        tokenizers=tokenizers,
        weights=weights,
        progress={"step": step, "best_bleu": 1.0},
        training_state={"optimizer": {"state": {}}, "rng": torch.get_rng_state()},
        ema_weights={"weight": torch.zeros(2)} if ema else None,
    )


def test_a_second_training_cannot_write_the_same_run_directory(tmp_path):
    held = lock_run_dir(tmp_path)
    try:
        with pytest.raises(MtkitError, match="another training"):
            lock_run_dir(tmp_path)
        with pytest.raises(MtkitError, match="another training"):
            RunWriter(tmp_path)
    finally:
        held.close()
    lock_run_dir(tmp_path).close()  # free again once the first one is gone


def test_an_existing_run_is_refused_without_resume_or_overwrite_and_the_lock_is_released(tmp_path):
    (tmp_path / "last.pt").write_bytes(b"")
    with pytest.raises(MtkitError, match="--resume to continue it, --overwrite to start again"):
        RunWriter(tmp_path)
    RunWriter(tmp_path, resume=True).close()  # the refused attempt holds no lock


def test_resume_without_last_pt_is_a_clear_error(tmp_path):
    with pytest.raises(MtkitError, match="nothing to resume"):
        RunWriter(tmp_path / "new", resume=True)


def test_overwrite_deletes_the_previous_run_and_nothing_else(tmp_path):
    for name in [*RUN_FILES, "notes.txt", "config.yaml"]:
        (tmp_path / name).write_text("old")
    RunWriter(tmp_path, overwrite=True).close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "notes.txt", "train.lock"]


def test_save_writes_best_step_ema_and_last_and_keeps_the_newest_steps(tmp_path):
    run_dir = RunWriter(tmp_path)
    for step in (10, 20, 30):
        run_dir.save(checkpoint(step, ema=True), best=step == 20, keep=2)
    written = sorted(p.name for p in tmp_path.glob("*.pt"))
    assert written == ["best.pt", "ema.pt", "last.pt", "step_00000020.pt", "step_00000030.pt"]
    best, last, ema = (read_checkpoint(tmp_path / name) for name in ("best.pt", "last.pt", "ema.pt"))
    assert best["step"] == 20 and best["progress"]["step"] == 20 and "optimizer" not in best
    assert last["step"] == 30 and "optimizer" in last and "rng" in last
    assert torch.equal(last["model"]["weight"], torch.full((2,), 30.0))
    assert torch.equal(ema["model"]["weight"], torch.zeros(2)) and ema["step"] == 30
    assert best["tokenizers"] == {"src": b"src", "tgt": b"tgt"}


def test_save_without_keep_or_ema_writes_only_last(tmp_path):
    RunWriter(tmp_path).save(checkpoint(5), best=False, keep=0)
    assert [p.name for p in tmp_path.glob("*.pt")] == ["last.pt"]


def test_a_failed_write_is_one_line_that_says_the_previous_checkpoints_are_intact(tmp_path, monkeypatch):
    def disk_full(payload, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mtkit.training.run_writer, "save_checkpoint", disk_full)
    with pytest.raises(MtkitError, match="No space left on device.*previous checkpoints are intact") as error:
        RunWriter(tmp_path).save(checkpoint(5), best=True, keep=0)
    assert "\n" not in str(error.value) and error.value.__cause__ is None


def test_config_and_log_records_are_written(tmp_path):
    run_dir = RunWriter(tmp_path)
    config = config_from_dict({"train": {"max_steps": 7}})
    run_dir.write_config(config)
    run_dir.append_log({"step": 1, "train_loss": 2.5})
    run_dir.append_log({"step": 2, "train_loss": 2.0})
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["max_steps"] == 7
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert records == [{"step": 1, "train_loss": 2.5}, {"step": 2, "train_loss": 2.0}]
