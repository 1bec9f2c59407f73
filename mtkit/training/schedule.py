"""Learning-rate schedules (`train.schedule`): the factor of `train.lr` at each update.

Every schedule warms up linearly over `warmup_steps` updates. Then `inverse_sqrt` decays as
1/sqrt(update) without end; `linear` and `cosine` decay from the peak to `min_lr` exactly at
`max_steps`, or, when only `max_time` bounds the run, by the share of that time already trained,
so the last update of a time-budgeted run is at the floor whatever the machine's speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mtkit.config import TrainConfig, parse_duration


def schedule_factor(config: TrainConfig, elapsed: Callable[[], float]) -> Callable[[int], float]:
    """The factor for update number `completed + 1` (`LambdaLR` passes the updates already made).

    `elapsed()` gives the seconds trained so far; only time-based decay reads it.
    """
    warmup, floor = config.warmup_steps, config.min_lr / config.lr
    if config.schedule == "inverse_sqrt":
        return lambda completed: min((completed + 1) / warmup, math.sqrt(warmup / (completed + 1)))
    max_time = parse_duration(config.max_time)  # the recipe's check: max_steps or max_time is set
    shape = _linear if config.schedule == "linear" else _cosine

    def factor(completed: int) -> float:
        update = completed + 1
        if update < warmup:
            return update / warmup
        if config.max_steps:
            done = (update - warmup) / max(config.max_steps - warmup, 1)
        else:
            done = elapsed() / max_time  # type: ignore[operator]
        return floor + (1.0 - floor) * shape(min(max(done, 0.0), 1.0))

    return factor


def _linear(done: float) -> float:
    return 1.0 - done


def _cosine(done: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * done))
