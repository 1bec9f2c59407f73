"""Resuming a run a crash left behind, from a tiny training (four updates, then four more): a log.jsonl line cut short
and the records of steps after last.pt, and a best.pt written after last.pt (a stop between the two writes)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from helpers import invoke, prepared_reverse_task

from mtkit.config import Config
from mtkit.models.checkpoint import read_checkpoint, save_checkpoint
from mtkit.training.trainer import train


@pytest.fixture(scope="module")
def four_updates(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """The reverse task trained four updates, validated at 2 and 4; tests resume copies of its run directory."""
    config = prepared_reverse_task(tmp_path_factory.mktemp("reverse"), max_steps=4, validate_every=2, log_every=1)
    train(config)
    return config


def resumable_copy(config: Config, tmp_path: Path) -> Config:
    run_dir = tmp_path / "run"
    shutil.copytree(config.run_path, run_dir)
    return dataclasses.replace(config, run_dir=str(run_dir))


def log_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_a_cut_log_line_is_dropped_on_resume_and_the_resumed_run_ends_well(four_updates, tmp_path, capsys):
    config = resumable_copy(four_updates, tmp_path)
    log = config.run_path / "log.jsonl"
    before = log.read_text()
    # the killed run went one update past last.pt, and a full disk cut its next record short
    log.write_text(before + json.dumps({"step": 5, "epoch": 1, "train_loss": 99.0}) + "\n" + '{"step": 5')
    capsys.readouterr()
    train(dataclasses.replace(config, train=dataclasses.replace(config.train, max_steps=8)), resume=True)
    said = capsys.readouterr().err
    assert "dropped 1 line cut short and 1 record of steps after 4, trained again" in said
    assert log.read_text().startswith(before)
    losses = [record["step"] for record in log_records(config.run_path) if "train_loss" in record]
    assert losses == list(range(1, 9))  # each update logged once: none from the killed run, none twice
    assert (config.run_path / "curves.png").is_file()


def test_plot_draws_a_log_with_a_cut_last_line_and_says_it_skipped_it(four_updates, tmp_path):
    config = resumable_copy(four_updates, tmp_path)
    with open(config.run_path / "log.jsonl", "a") as log:
        log.write('{"step": 5, "epoch"')
    lines = len((config.run_path / "log.jsonl").read_text().splitlines())
    result = invoke("plot", config.run_path, "-o", tmp_path / "curves.png")
    assert result.exit_code == 0, result.output
    assert f"log.jsonl:{lines}: skipped a last line cut short" in result.stderr
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_best_pt_newer_than_last_pt_is_not_replaced_by_a_worse_model_on_resume(four_updates, tmp_path, capsys):
    config = resumable_copy(four_updates, tmp_path)
    best_path, last_path = config.run_path / "best.pt", config.run_path / "last.pt"
    last = read_checkpoint(last_path)
    # the window: best.pt of a validation at step 6 was written, and the run was killed before last.pt followed
    last["progress"] |= {"best_bleu": -1.0, "best_step": 0}  # last.pt from before any validation improved
    save_checkpoint(last, last_path)
    newer = read_checkpoint(best_path)
    newer["progress"] |= {"step": 6, "best_step": 6, "best_bleu": 50.0}  # out of reach of four more updates
    newer["step"] = 6
    save_checkpoint(newer, best_path)
    capsys.readouterr()
    train(dataclasses.replace(config, train=dataclasses.replace(config.train, max_steps=8)), resume=True)
    kept = read_checkpoint(best_path)
    assert kept["progress"]["best_bleu"] == 50.0 and kept["step"] == 6
    assert read_checkpoint(last_path)["progress"]["best_bleu"] == 50.0
    assert "best.pt (step 6, best_bleu 50.0) is newer than last.pt (step 4)" in capsys.readouterr().err
