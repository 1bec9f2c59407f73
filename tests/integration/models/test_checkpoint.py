"""Checkpoint averaging: the mean of the kept step checkpoints, usable like any checkpoint."""

from __future__ import annotations

import pytest
import torch
from helpers import prepared_reverse_task
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.models.checkpoint import read_checkpoint
from mtkit.training.trainer import train


@pytest.mark.slow
def test_average_of_the_last_checkpoints_is_their_mean_and_translates(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=15, validate_every=5, keep=3)
    train(config)
    run = config.run_path
    result = CliRunner().invoke(app, ["average", "-m", str(run), "--last", "2"])
    assert result.exit_code == 0, result.output
    assert "step_00000010.pt, step_00000015.pt" in result.stdout
    averaged = read_checkpoint(run / "average.pt")
    newer, older = read_checkpoint(run / "step_00000015.pt"), read_checkpoint(run / "step_00000010.pt")
    for name, value in averaged["model"].items():
        torch.testing.assert_close(value, (newer["model"][name] + older["model"][name]) / 2, msg=name)
    assert not torch.equal(averaged["model"]["output.weight"], newer["model"]["output.weight"])
    assert averaged["averaged_from"] == ["step_00000010.pt", "step_00000015.pt"]
    translated = CliRunner().invoke(app, ["translate", "-m", str(run / "average.pt")], input="a b c\n\n")
    assert translated.exit_code == 0 and len(translated.stdout.splitlines()) == 2


@pytest.mark.slow
def test_averaging_more_checkpoints_than_kept_is_a_clear_error(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=5, validate_every=5, keep=1)
    train(config)
    result = CliRunner().invoke(app, ["average", "-m", str(config.run_path), "--last", "3"])
    assert result.exit_code == 2
    assert "1 step_*.pt checkpoints found" in result.stderr and "train.keep=3" in result.stderr
