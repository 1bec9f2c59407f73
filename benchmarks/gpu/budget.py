"""The check's time budget: each item's cost is guessed (or measured, once something like it ran) before it
starts, and an item that no longer fits in what is left is skipped, with a line on stderr and a row in the JSON.

A lent GPU runs one call under a hard timeout; a check that stops itself before it keeps everything it
measured, where one killed at the timeout keeps only what it had written.
"""

from __future__ import annotations

import math
import sys
import time

# Guesses, in seconds on a lent H100/H200, for items not yet measured in this run (a measured item of the same
# kind replaces them): an eager variant built and warmed up, one timed window, a cold compile (the docs' 104-208 s
# on an H200 with Tatoeba's shapes, more with WMT-length ones), the profile, one parity training run.
GUESSES = {"build": 30.0, "window": 10.0, "compile cold": 360.0, "compile warm": 120.0, "profile": 30.0, "parity run": 240.0}
MARGIN = 0.03  # of the budget kept back for writing the JSON and the tables at the end


class Budget:
    """Seconds left of `--budget` (None: no limit), the costs measured so far by kind, and what was skipped."""

    def __init__(self, seconds: float | None, overrides: dict[str, float] | None = None) -> None:
        self.seconds = seconds
        self.start = time.monotonic()
        self.overrides = overrides or {}  # --estimate ITEM=SECONDS: the estimate of one named item
        self.measured: dict[str, list[float]] = {}
        self.skipped: list[dict] = []

    def left(self) -> float:
        """Seconds left, less the margin kept for the end; infinite without a budget."""
        if self.seconds is None:
            return math.inf
        return self.seconds * (1 - MARGIN) - (time.monotonic() - self.start)

    def estimate(self, kind: str, model: str = "", scale: float = 1.0) -> float:
        """The mean measured cost of `kind` (a GUESSES key) for `model` so far, else its guess times `scale`."""
        costs = self.measured.get(f"{kind} {model}".strip())
        return sum(costs) / len(costs) if costs else scale * GUESSES[kind]

    def note(self, kind: str, seconds: float, model: str = "") -> None:
        """What an item of `kind` cost for `model`: the next estimate of its kind for that model uses it."""
        self.measured.setdefault(f"{kind} {model}".strip(), []).append(seconds)

    def fits(self, item: str, estimate: float) -> bool:
        """Whether `item` (estimated at `estimate` s, or its --estimate) fits in what is left; if not, it is recorded
        as skipped and said on stderr."""
        estimate, left = self.overrides.get(item, estimate), self.left()
        if estimate <= left:
            return True
        self.skipped.append({"item": item, "estimate_s": round(estimate, 1), "left_s": round(left, 1)})
        print(f"budget: skipped {item}: about {estimate:.0f} s needed, {left:.0f} s left", file=sys.stderr, flush=True)
        return False

    def report(self) -> dict:
        """The budget, the seconds used, the costs measured by kind and the items skipped, for the JSON."""
        used = time.monotonic() - self.start
        measured = {kind: [round(cost, 1) for cost in costs] for kind, costs in self.measured.items()}
        return {"seconds": self.seconds, "used_s": round(used, 1), "measured_s": measured, "skipped": self.skipped}


def parse_estimates(items: list[str]) -> dict[str, float]:
    """--estimate ITEM=SECONDS options as a dict; ValueError names a malformed one."""
    estimates = {}
    for item in items:
        name, equals, seconds = item.rpartition("=")
        if not equals or not name:
            raise ValueError(f"--estimate {item!r}: give ITEM=SECONDS, e.g. 'compile cold=600'")
        estimates[name] = float(seconds)
    return estimates
