"""Length buckets (`train.shapes`) and exact resume: a run stopped mid-epoch and resumed ends on the
weights and losses of a run that was never stopped (the epoch's bucketed batches rebuilt from (seed, epoch))."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import prepared_reverse_task

from mtkit.models.checkpoint import read_checkpoint
from mtkit.training.trainer import Trainer, train


@pytest.mark.slow
def test_a_bucketed_run_resumed_mid_epoch_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    settings = {"max_steps": 8, "validate_every": 8, "log_every": 2, "batch_tokens": 300, "shapes": "4"}
    straight = prepared_reverse_task(tmp_path / "straight", **settings)
    straight.model.dropout = 0.2  # dropout makes the RNG state part of what must be restored
    train(straight)

    interrupted = prepared_reverse_task(tmp_path / "interrupted", **settings)
    interrupted.model.dropout = 0.2
    limit = Trainer._limit_reached  # stopped at update 4 (mid-epoch) as by Ctrl-C
    monkeypatch.setattr(Trainer, "_limit_reached", lambda trainer: trainer.progress.step >= 4 or limit(trainer))
    train(interrupted)
    assert read_checkpoint(interrupted.run_path / "last.pt")["progress"]["batches_done"] == 4
    monkeypatch.undo()
    train(interrupted, resume=True)

    straight_end, resumed_end = (read_checkpoint(config.run_path / "last.pt") for config in (straight, interrupted))
    assert (resumed_end["step"], straight_end["step"]) == (8, 8)
    differ = [name for name, value in straight_end["model"].items() if not torch.equal(resumed_end["model"][name], value)]
    assert not differ

    def log(config):
        return [json.loads(line) for line in (config.run_path / "log.jsonl").read_text().splitlines()]

    losses = [{r["step"]: r["train_loss"] for r in log(config) if "train_loss" in r} for config in (straight, interrupted)]
    assert losses[0] == losses[1] and len(losses[0]) == 4
    epochs = [r for r in log(straight) if "shapes" in r]
    assert epochs and 1 <= epochs[0]["shapes"] <= 4 and 0 < epochs[0]["padding"] < 1
