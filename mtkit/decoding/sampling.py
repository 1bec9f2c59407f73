"""Sampling's draw: a token per row from the top-k or nucleus of the temperature-scaled distribution
(`mtkit translate --sampling`, back-translation's sampled sources).

A drawn token keeps the model's own log-probability, so a sample is scored like any hypothesis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mtkit.config import TEMPERATURE
from mtkit.errors import OptionError

SEED_LIMIT = 2**64 - 1  # torch's generators take 64-bit seeds


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Draw each token instead of searching: from the `top_k` most probable tokens (0: all), or
    from the fewest whose probabilities reach `top_p`, after dividing the logits by `temperature`."""

    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    seed: int = 0

    @classmethod
    def parse(cls, text: str, temperature: float = 1.0, *, seed: int = 0) -> Sampling:
        """`topk:K`, `topp:P` or `full` (the option `--sampling`), checked."""
        kind, _, value = text.partition(":")
        if not TEMPERATURE.admits(temperature):
            raise OptionError(
                "temperature",
                "{temperature} {value}: give {range}, such as 1.0 (sharper below 1)",
                value=temperature,
                range=TEMPERATURE.describe(whole=False),
            )
        if not 0 <= seed <= SEED_LIMIT:
            raise OptionError("seed", "{seed} {value}: give a whole number from 0 to 2^64-1, such as 1", value=seed)
        try:
            if kind == "full" and not value:
                return cls(temperature=temperature, seed=seed)
            if kind == "topk" and int(value) >= 1:
                return cls(top_k=int(value), temperature=temperature, seed=seed)
            if kind == "topp" and 0.0 < float(value) <= 1.0:
                return cls(top_p=float(value), temperature=temperature, seed=seed)
        except ValueError:
            pass
        raise OptionError(
            "sampling", "{sampling} {value}: give topk:K (K >= 1), topp:P (0 < P <= 1) or full, such as topk:10", value=text
        )


def draw(log_probs: Tensor, sampling: Sampling, *, generator: torch.Generator, never: Sequence[int] = ()) -> Tensor:
    """One token per row of log_probs (R, V), drawn as `sampling` says, never one of `never`; (R,) ids.

    `never` holds tokens no output contains (padding, BOS), which a high temperature would draw.
    """
    logits = log_probs / sampling.temperature  # (R, V)
    if never:
        logits = logits.index_fill(1, torch.tensor(list(never), device=logits.device), float("-inf"))
    if sampling.top_k:
        kth = logits.topk(min(sampling.top_k, logits.size(1)), dim=1).values[:, -1:]  # (R, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=1, descending=True)  # (R, V)
        before = sorted_logits.softmax(dim=1).cumsum(dim=1) - sorted_logits.softmax(dim=1)  # mass ranked above each
        drop = torch.zeros_like(logits, dtype=torch.bool).scatter(1, order, before >= sampling.top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.multinomial(logits.softmax(dim=1), 1, generator=generator).squeeze(1)
