"""RunWriter, a training's hold on its run directory: the lock, refuse / overwrite / resume, checkpoints, the log."""

from __future__ import annotations

import dataclasses
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


def sharded_checkpoint(step: int) -> Checkpoint:
    """train.shard=fsdp's: last.pt names the folder of its shards instead of holding the optimiser."""
    record = {"folder": f"sharded/step_{step:08d}", "processes": 2, "optimizer": True}
    return dataclasses.replace(checkpoint(step), training_state={"sharded": record, "rng": torch.get_rng_state()})


def test_only_the_shards_last_pt_names_are_kept_and_overwrite_removes_them(tmp_path):
    shards = tmp_path / "sharded"
    run_dir = RunWriter(tmp_path)
    for step in (10, 20):  # the ranks write their shards, then rank 0 last.pt
        (shards / f"step_{step:08d}").mkdir(parents=True)
        run_dir.save(sharded_checkpoint(step), best=False, keep=0)
    assert [path.name for path in shards.iterdir()] == ["step_00000020"]
    run_dir.close()
    (shards / "step_00000030").mkdir()  # written, but killed before last.pt named it
    RunWriter(tmp_path, resume=True).close()
    assert [path.name for path in shards.iterdir()] == ["step_00000020"]
    RunWriter(tmp_path, overwrite=True).close()
    assert not shards.exists()


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


# Repairs after a crash: killed writes' temporary files, a cut log line, a best.pt newer than last.pt


def record(step: int, **fields: object) -> str:
    return json.dumps({"step": step, **fields}) + "\n"


def test_killed_writes_temporary_files_are_removed_on_start_resume_and_overwrite(tmp_path, capsys):
    killed = [".last.pt.k3x_9a2b.tmp", ".step_00000010.pt.abcdefgh.tmp", ".log.jsonl.0a1b2c3d.tmp"]
    not_ours = [".notes.txt.abcdefgh.tmp", ".last.pt.tmp", ".last.pt.TOOLONG99.tmp", "last.pt.abcdefgh.tmp"]
    for opened in ({}, {"resume": True}, {"overwrite": True}):
        for name in [*killed, *not_ours, *(["last.pt"] if opened else [])]:
            (tmp_path / name).write_bytes(b"x" * 1000)
        RunWriter(tmp_path, **opened).close()
        assert not any((tmp_path / name).exists() for name in killed), opened
        assert all((tmp_path / name).exists() for name in not_ours), opened
        assert f"{tmp_path}: removed 3 temporary files of interrupted writes" in capsys.readouterr().err


def test_the_leftovers_found_are_named_as_the_atomic_writer_names_its_temporary_files(tmp_path):
    from mtkit.run_files import RunFiles
    from mtkit.textio import atomic_file

    with atomic_file(tmp_path / "best.pt", binary=True) as file:
        file.write(b"half")
        file.flush()
        (live,) = RunFiles(tmp_path).leftover_temporaries()  # a killed write would leave this one
        assert live.read_bytes() == b"half"
    assert RunFiles(tmp_path).leftover_temporaries() == []


def test_resume_keeps_the_whole_records_up_to_last_pt_and_says_what_it_dropped(tmp_path, capsys):
    kept = record(0, corpus_pairs=3) + record(2, train_loss=1.5) + record(4, valid_bleu=3.0)
    (tmp_path / "last.pt").write_bytes(b"")
    (tmp_path / "log.jsonl").write_text(kept + record(5, train_loss=1.0) + record(6, train_loss=0.9) + '{"step": 6, "va')
    writer = RunWriter(tmp_path, resume=True)
    writer.trim_log(4)
    assert (tmp_path / "log.jsonl").read_text() == kept
    said = capsys.readouterr().err.strip()
    assert said == f"{tmp_path / 'log.jsonl'}: dropped 1 line cut short and 2 records of steps after 4, trained again; " \
                   "the log goes on from last.pt's step 4"  # fmt: skip
    inode = (tmp_path / "log.jsonl").stat().st_ino
    writer.trim_log(4)  # nothing to drop: the file is left as it is, and nothing said
    assert (tmp_path / "log.jsonl").stat().st_ino == inode and capsys.readouterr().err == ""
    writer.close()


def test_a_failed_log_append_is_one_line(tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    writer = RunWriter(tmp_path)
    monkeypatch.setattr(mtkit.training.run_writer, "open", disk_full, raising=False)
    with pytest.raises(MtkitError, match=r"log\.jsonl: could not append a record \(No space left on device\).*--resume") as error:
        writer.append_log({"step": 1, "train_loss": 2.5})
    assert "\n" not in str(error.value) and error.value.__cause__ is None
    writer.close()


def test_a_failed_curve_drawing_is_a_warning_and_the_end_of_training_tries_again(tmp_path, monkeypatch, capsys):
    from helpers import write_log

    attempts = []

    def disk_full(runs, output):
        attempts.append(output)
        raise MtkitError(f"{output}: cannot write (No space left on device); check the directory is writable and has space")

    monkeypatch.setattr(mtkit.training.run_writer, "plot_curves", disk_full)
    writer = RunWriter(write_log(tmp_path / "run", 5.0))
    writer._curves_due_at = 0.0  # due now
    assert not writer.draw_curves()
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("mtkit: warning: ") and "No space left on device" in warning and "training goes on" in warning
    assert "\n" not in warning
    assert not writer.draw_curves(final=True) and len(attempts) == 2  # the end draws what is not drawn yet
    writer.close()
