"""Exponential moving average of the weights: the arithmetic, tied weights and the decay's range (in training:
tests/integration/training/test_ema.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtkit.config import config_from_dict
from mtkit.errors import MtkitError
from mtkit.training.ema import WeightEMA


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
