"""Exponential moving average of the weights: the arithmetic, tied weights, ema.pt, its final validation and exact resume."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import prepared_reverse_task
from torch import nn

from mtkit.config import config_from_dict
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.evaluation.metrics import bleu
from mtkit.models.checkpoint import read_checkpoint, resolve_checkpoint, save_checkpoint
from mtkit.training.ema import WeightEMA
from mtkit.training.trainer import train


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(4, 3)
        self.output = nn.Linear(3, 4, bias=False)
        self.output.weight = self.embed.weight


def test_average_follows_the_warmed_up_decay():
    model = nn.Linear(2, 1)
    ema = WeightEMA(model, decay=0.9)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update()  # decay min(0.9, 2/11)
    expected = start * (2 / 11) + 1.0 * (9 / 11)
    torch.testing.assert_close(ema.weights()["weight"], expected)
    for _ in range(79):  # (1 + n) / (10 + n) reaches 0.9 at n = 80
        ema.update()
    assert ema.current_decay() == 0.9
    # The weights stay at 1, so the average converges to them; the model itself is untouched.
    assert (ema.weights()["weight"] - 1.0).abs().max() < (expected - 1.0).abs().max() * 1e-3
    assert torch.equal(model.weight, torch.ones_like(model.weight))


def test_tied_weights_share_one_average():
    model = _Tied()
    ema = WeightEMA(model, decay=0.5)
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    ema.update()
    weights = ema.weights()
    assert set(weights) == set(model.state_dict())
    torch.testing.assert_close(weights["embed.weight"], weights["output.weight"], rtol=0, atol=0)

    restored = WeightEMA(_Tied(), decay=0.5)
    restored.load_state_dict(ema.state_dict())
    assert restored.updates == 1
    torch.testing.assert_close(restored.weights()["output.weight"], weights["output.weight"], rtol=0, atol=0)


def test_decay_outside_zero_one_is_a_clear_error():
    with pytest.raises(MtkitError, match="train.ema"):
        config_from_dict({"train": {"ema": 1.5}})


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
