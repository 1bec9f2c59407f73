"""Learning-rate schedules: values at chosen updates, decay by wall-clock time, and the recipe's checks."""

from __future__ import annotations

import math

import pytest

from mtkit.config import TrainConfig, config_from_dict
from mtkit.errors import MtkitError
from mtkit.training.schedule import schedule_factor

# warmup 10, decay over updates 10..110 to a floor of 0.1 (min_lr / lr)
STEPS = {"lr": 1.0, "min_lr": 0.1, "warmup_steps": 10, "max_steps": 110}


def factor(schedule: str, **changes: object):
    return schedule_factor(TrainConfig(**{**STEPS, "schedule": schedule, **changes}), lambda: 0.0)


@pytest.mark.parametrize(
    ("schedule", "at_35", "at_60"),
    [("linear", 0.1 + 0.9 * 0.75, 0.55), ("cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)), 0.55)],
)
def test_linear_and_cosine_warm_up_then_reach_the_floor_exactly_at_max_steps(schedule, at_35, at_60):
    rate = factor(schedule)  # called with the number of updates already made: update n is rate(n - 1)
    assert rate(0) == pytest.approx(0.1) and rate(4) == pytest.approx(0.5)  # linear warmup
    assert rate(9) == pytest.approx(1.0)
    assert rate(34) == pytest.approx(at_35) and rate(59) == pytest.approx(at_60)
    assert rate(109) == pytest.approx(0.1)  # the last update is at the floor
    assert rate(500) == pytest.approx(0.1)  # and stays there
    assert all(rate(n) >= rate(n + 1) for n in range(9, 120))  # decays without a rise


def test_with_only_max_time_the_decay_follows_the_clock():
    clock = [0.0]
    rate = schedule_factor(
        TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=10, max_steps=0, max_time="100s", schedule="linear"), lambda: clock[0]
    )
    assert rate(4) == pytest.approx(0.5)  # warmup still counts updates
    for seconds, expected in ((0.0, 1.0), (25.0, 0.75), (50.0, 0.5), (100.0, 0.0), (130.0, 0.0)):
        clock[0] = seconds
        assert rate(1000) == pytest.approx(expected)


def test_inverse_sqrt_is_unchanged_and_ignores_the_clock():
    rate = schedule_factor(TrainConfig(warmup_steps=100), lambda: 1e9)
    assert [rate(n) for n in (0, 49, 99, 399, 9_999)] == pytest.approx([0.01, 0.5, 1.0, 0.5, 0.1])


def test_a_decay_without_an_end_or_a_floor_above_the_peak_is_refused_at_load():
    with pytest.raises(MtkitError, match="train.schedule.*set train.max_steps or train.max_time"):
        config_from_dict({"train": {"schedule": "cosine", "max_steps": 0}})
    with pytest.raises(MtkitError, match="train.min_lr.*below train.lr"):
        config_from_dict({"train": {"lr": 0.001, "min_lr": 0.002, "max_steps": 10}})
    assert config_from_dict({"train": {"schedule": "linear", "max_time": "15m"}}).train.schedule == "linear"
