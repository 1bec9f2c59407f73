"""What search may emit next: forced target prefixes, n-gram blocking, and sampling's draw.

Both search functions call `Constraints.apply` on every step's next-token log-probabilities; with
no prefix and no n-gram size it is never built, so plain search does no extra work. Forced and
blocked tokens keep the model's own log-probabilities, so a hypothesis's score is always the model's
log-probability of its tokens, whatever steered it there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mtkit.errors import MtkitError

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
    def parse(cls, text: str, temperature: float = 1.0, seed: int = 0) -> Sampling:
        """`topk:K`, `topp:P` or `full` (the option `--sampling`), checked."""
        kind, _, value = text.partition(":")
        if not math.isfinite(temperature) or temperature <= 0:
            raise MtkitError(f"--temperature {temperature}: give a finite number > 0, such as 1.0 (sharper below 1)")
        if not 0 <= seed <= SEED_LIMIT:
            raise MtkitError(f"--seed {seed}: give a whole number from 0 to 2^64-1, such as 1")
        try:
            if kind == "full" and not value:
                return cls(temperature=temperature, seed=seed)
            if kind == "topk" and int(value) >= 1:
                return cls(top_k=int(value), temperature=temperature, seed=seed)
            if kind == "topp" and 0.0 < float(value) <= 1.0:
                return cls(top_p=float(value), temperature=temperature, seed=seed)
        except ValueError:
            pass
        raise MtkitError(f"--sampling {text}: give topk:K (K >= 1), topp:P (0 < P <= 1) or full, such as topk:10")


def draw(log_probs: Tensor, sampling: Sampling, generator: torch.Generator, never: Sequence[int] = ()) -> Tensor:
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


class Constraints:
    """Per-sentence target prefixes and an n-gram size that may not repeat, for one batch of search.

    prefixes: target ids each sentence's output must start with (in batch order; [] for none);
    no_repeat_ngram: 0, or N >= 1: no N-gram may appear twice in an output.
    """

    def __init__(self, prefixes: list[list[int]] | None, no_repeat_ngram: int, device: torch.device) -> None:
        prefixes = prefixes or []
        self.prefix_length = max((len(p) for p in prefixes), default=0)
        self.prefixes = torch.full((len(prefixes), max(self.prefix_length, 1)), -1, dtype=torch.long)  # (B, P), -1: none
        for row, prefix in enumerate(prefixes):
            self.prefixes[row, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
        self.prefixes = self.prefixes.to(device)
        self.no_repeat_ngram = no_repeat_ngram

    @classmethod
    def build(cls, prefixes: list[list[int]] | None, no_repeat_ngram: int, device: torch.device) -> Constraints | None:
        """None when nothing is constrained, so search skips the step entirely."""
        if no_repeat_ngram == 0 and not any(prefixes or []):
            return None
        return cls(prefixes, no_repeat_ngram, device)

    def apply(self, log_probs: Tensor, tokens: Tensor, sentence: Tensor, step: int) -> Tensor:
        """log_probs (R, V) of the next token after `tokens` (R, 1 + step), BOS first, for rows of
        batch sentences `sentence` (R,): n-gram repeats made impossible, then prefix tokens forced."""
        steered = self._block_repeats(log_probs, tokens[:, 1:]) if self.no_repeat_ngram else log_probs
        if step < self.prefix_length:
            return self._force_prefix(steered, log_probs, self.prefixes[sentence, step])
        return steered

    def _block_repeats(self, log_probs: Tensor, generated: Tensor) -> Tensor:
        """Tokens that would complete an n-gram already in `generated` (R, L) get -inf."""
        size = self.no_repeat_ngram
        if generated.size(1) < size:
            return log_probs
        ngrams = generated.unfold(1, size, 1)  # (R, W, N): every n-gram so far
        last = generated[:, generated.size(1) - size + 1 :].unsqueeze(1)  # (R, 1, N-1): the n-gram being built
        seen = (ngrams[:, :, :-1] == last).all(dim=2)  # (R, W) n-grams that start like it
        blocked = torch.zeros_like(log_probs).scatter_add_(1, ngrams[:, :, -1], seen.to(log_probs.dtype)) > 0  # (R, V)
        return log_probs.masked_fill(blocked, float("-inf"))

    @staticmethod
    def _force_prefix(steered: Tensor, log_probs: Tensor, forced: Tensor) -> Tensor:
        """Rows with a forced token (forced (R,), -1: none) keep only that token, with its model
        log-probability (a prefix is forced even where it repeats an n-gram); other rows keep `steered`."""
        rows = forced.ge(0)  # (R,)
        token = forced.clamp(min=0).unsqueeze(1)  # (R, 1)
        only = torch.full_like(log_probs, float("-inf")).scatter(1, token, log_probs.gather(1, token))
        return torch.where(rows.unsqueeze(1), only, steered)
