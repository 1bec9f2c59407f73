"""The exponential moving average in training: ema.pt, exact resume of the average, and its final validation."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import prepared_reverse_task

from mtkit.decoding.translator import Translator
from mtkit.evaluation.metrics import bleu
from mtkit.models.checkpoint import read_checkpoint, resolve_checkpoint, save_checkpoint
from mtkit.training.trainer import train


@pytest.mark.slow
def test_training_writes_ema_pt_and_resume_continues_the_average_exactly(tmp_path):
    settings = {"max_steps": 40, "validate_every": 20, "log_every": 5, "batch_tokens": 300, "ema": 0.9}
    straight = prepared_reverse_task(tmp_path / "straight", **settings)
    train(straight)
    interrupted = prepared_reverse_task(tmp_path / "interrupted", **settings)
    interrupted.train.max_steps = 20
    train(interrupted)
    interrupted.train.max_steps = 40
    train(interrupted, resume=True)

    straight_ema = read_checkpoint(straight.run_path / "ema.pt")
    resumed_ema = read_checkpoint(interrupted.run_path / "ema.pt")
    last = read_checkpoint(straight.run_path / "last.pt")
    assert resumed_ema["step"] == straight_ema["step"] == 40
    assert last["ema"]["updates"] == 40
    for name, value in straight_ema["model"].items():
        torch.testing.assert_close(resumed_ema["model"][name], value, rtol=0, atol=0, msg=name)
    assert not torch.equal(straight_ema["model"]["output.weight"], last["model"]["output.weight"])
    translator = Translator.load(straight.run_path / "ema.pt")
    assert len(translator.translate(["a b c", ""], beam=2)) == 2


@pytest.mark.slow
def test_the_final_ema_is_validated_and_the_run_uses_the_best_validated_checkpoint(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=30, validate_every=10, keep=2, average_last=2, ema=0.9)
    train(config)
    run = config.run_path
    ema = read_checkpoint(run / "ema.pt")
    sources = (tmp_path / "raw/valid.src").read_text().splitlines()
    targets = (tmp_path / "raw/valid.tgt").read_text().splitlines()
    decoded = Translator.load(run / "ema.pt").translate(sources, beam=config.train.valid_beam)
    assert ema["valid_bleu"] == pytest.approx(bleu(decoded, targets))  # the BLEU of these very weights
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert records[-1]["ema_valid_bleu"] == ema["valid_bleu"] and "average_valid_bleu" in records[-2]
    average = read_checkpoint(run / "average.pt")
    best = read_checkpoint(run / "best.pt")["progress"]["best_bleu"]
    for ema_bleu, average_bleu, chosen in (
        (best + 2, best + 1, "ema.pt"),
        (best + 1, best + 2, "average.pt"),
        (best + 1, best + 1, "average.pt"),  # a tie between the two goes to the average
        (best - 1, best - 2, "best.pt"),
        (best, best - 2, "ema.pt"),  # a tie with best.pt goes to the moving average
    ):
        save_checkpoint({**ema, "valid_bleu": ema_bleu}, run / "ema.pt")
        save_checkpoint({**average, "valid_bleu": average_bleu}, run / "average.pt")
        assert resolve_checkpoint(run).name == chosen, (ema_bleu, average_bleu)
    ema.pop("valid_bleu")  # as written during training: not validated yet, never chosen
    save_checkpoint({**ema}, run / "ema.pt")
    save_checkpoint({**average, "valid_bleu": best - 1}, run / "average.pt")
    assert resolve_checkpoint(run).name == "best.pt"
