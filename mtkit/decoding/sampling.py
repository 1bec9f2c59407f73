"""Sampling's draw: a token per row from the top-k or nucleus of the temperature-scaled distribution
(`mtkit translate --sampling`, back-translation's sampled sources).

A drawn token keeps the model's own log-probability, so a sample is scored like any hypothesis.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mtkit.decoding.options import Sampling


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
