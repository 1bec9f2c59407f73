"""What search may emit next at each step: forced target prefixes and n-gram blocking.

Both search functions call `StepRules.apply` on every step's next-token log-probabilities; with
no prefix and no n-gram size it is never built, so plain search does no extra work. Forced and
blocked tokens keep the model's own log-probabilities, so a hypothesis's score is always the model's
log-probability of its tokens, whatever steered it there.
"""

from __future__ import annotations

import torch
from torch import Tensor


class StepRules:
    """Per-sentence target prefixes and an n-gram size that may not repeat, for one batch of search.

    prefixes: target ids each sentence's output must start with (in batch order; [] for none);
    no_repeat_ngram: 0, or N >= 1: no N-gram may appear twice in an output;
    forced_lead: how many of each prefix's first tokens are a language code, forced at log-probability 0 as
    transformers' `forced_bos_token_id` forces it (the rest of a prefix keeps the model's log-probabilities).
    """

    def __init__(
        self, prefixes: list[list[int]] | None, no_repeat_ngram: int, *, device: torch.device, forced_lead: int = 0
    ) -> None:
        prefixes = prefixes or []
        self.prefix_length = max((len(p) for p in prefixes), default=0)
        self.prefixes = torch.full((len(prefixes), max(self.prefix_length, 1)), -1, dtype=torch.long)  # (B, P), -1: none
        for row, prefix in enumerate(prefixes):
            self.prefixes[row, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
        self.prefixes = self.prefixes.to(device)
        self.no_repeat_ngram = no_repeat_ngram
        self.forced_lead = forced_lead

    @classmethod
    def build(
        cls, prefixes: list[list[int]] | None, no_repeat_ngram: int, *, device: torch.device, forced_lead: int = 0
    ) -> StepRules | None:
        """None when nothing is constrained, so search skips the step entirely."""
        if no_repeat_ngram == 0 and not any(prefixes or []):
            return None
        return cls(prefixes, no_repeat_ngram, device=device, forced_lead=forced_lead)

    def apply(self, log_probs: Tensor, tokens: Tensor, *, sentence: Tensor, step: int) -> Tensor:
        """log_probs (R, V) of the next token after `tokens` (R, 1 + step), BOS first, for rows of
        batch sentences `sentence` (R,): n-gram repeats made impossible, then prefix tokens forced."""
        steered = self._block_repeats(log_probs, tokens[:, 1:]) if self.no_repeat_ngram else log_probs
        if step < self.prefix_length:
            scored = torch.zeros_like(log_probs) if step < self.forced_lead else log_probs
            return self._force_prefix(steered, scored, self.prefixes[sentence, step])
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
