"""Lexical constraints in beam search: where every beam stands with its terms, as tensors.

Each source may carry constraints; each constraint is one or more alternative phrases (target ids),
any one of which satisfies it. Beam search (`mtkit.decoding.search`) asks this module three things
at every step, with no loop over sentences:

- `hold_end`: end-of-sentence is impossible for a beam until all its constraints are met (except at
  the output cap, where the hypothesis ends and is flagged with what it misses);
- `allocate`: the candidates: the best 2K of the whole beam, each beam's best token, each beam's best
  word-boundary token, and each beam's next piece of every open phrase (dynamic beam allocation, Post
  and Vilar 2018, in the vectorised form of Hu et al. 2019). Each candidate's state is advanced, its
  bank is the number of constraint pieces it has met (then, within that, the pieces it is in the
  middle of). Half the beam (rounded up) goes to the best candidates by score, whatever their bank,
  so the hypotheses the model would keep on its own go on (a translation that has its terms anyway
  comes out much as without constraints); the rest is filled round-robin over the banks (every
  bank's best, highest bank first, then every bank's second...), so hypotheses that carry their
  terms survive beside better-scoring ones;
- `advance`: the state after a token. A phrase is met when all its pieces were produced in a row and
  the next token starts a new word (a piece with the word-start mark, punctuation, or end of
  sentence), so "Hund" is not met by the first piece of "Hunde". A phrase interrupted half-way is
  offered again from its first piece. With `in_order`, constraints are met in the order given.

Scores are never changed: a candidate's score is the model's own log-probability, so a
constrained hypothesis scores what `mtkit score` gives it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

Phrases = list[list[int]]  # the alternatives of one constraint, target ids each


@dataclass(frozen=True, kw_only=True)
class TermRequest:
    """The constraints of a batch of sources, as an engine receives them."""

    constraints: list[list[Phrases]]  # per source: its constraints, each a list of alternative phrases
    continues_word: tuple[bool, ...]  # per target id: the piece continues the word before it
    in_order: bool = False  # constraints must appear in the order given

    @property
    def any(self) -> bool:
        return any(self.constraints)


@dataclass(frozen=True, kw_only=True)
class Terms:
    """The constraints of the active sentences: A sentences, P phrases, J constraints, L pieces."""

    phrases: Tensor  # (A, P, L) ids of every alternative of every constraint; -1 pads
    lengths: Tensor  # (A, P) pieces of each phrase; 0 pads
    owner: Tensor  # (A, P, J) bool: phrase p is an alternative of constraint j
    weight: Tensor  # (A, J) pieces of each constraint's longest alternative (its part of the banks); 0 pads
    real: Tensor  # (A, J) bool: a constraint, not padding
    continues_word: Tensor  # (V,) bool
    in_order: bool
    scale: int = 1  # 1 + the most pieces a source's constraints hold: banks are met x scale + under way (no sync)

    @classmethod
    def build(cls, request: TermRequest, device: torch.device) -> Terms:
        per_source = request.constraints
        constraints = max(1, max(len(c) for c in per_source))
        phrases = max(1, max(sum(len(alternatives) for alternatives in c) for c in per_source))
        pieces = max([1] + [len(p) for c in per_source for alternatives in c for p in alternatives])
        table = torch.full((len(per_source), phrases, pieces), -1, dtype=torch.long)
        owner = torch.zeros(len(per_source), phrases, constraints, dtype=torch.bool)
        weight = torch.zeros(len(per_source), constraints, dtype=torch.long)
        for row, constraints_of_source in enumerate(per_source):
            p = 0
            for j, alternatives in enumerate(constraints_of_source):
                weight[row, j] = max(len(phrase) for phrase in alternatives)
                for phrase in alternatives:
                    table[row, p, : len(phrase)] = torch.tensor(phrase, dtype=torch.long)
                    owner[row, p, j] = True
                    p += 1
        parts = {"phrases": table, "lengths": table.ge(0).sum(2), "owner": owner, "weight": weight, "real": weight.gt(0)}
        scale = 1 + max(sum(max(len(p) for p in alternatives) for alternatives in c) for c in per_source)
        parts |= {"continues_word": torch.tensor(request.continues_word, dtype=torch.bool)}
        return cls(**{name: part.to(device) for name, part in parts.items()}, in_order=request.in_order, scale=scale)

    def fit(self, vocab: int) -> Terms:
        """These terms for a model of `vocab` output ids (ids beyond the tokenizer's start no word)."""
        if self.continues_word.numel() == vocab:
            return self
        table = torch.zeros(vocab, dtype=torch.bool, device=self.continues_word.device)
        shared = min(vocab, self.continues_word.numel())
        table[:shared] = self.continues_word[:shared]
        return replace(self, continues_word=table)

    def select(self, keep: Tensor) -> Terms:
        """The terms of the sentences `keep` (A',)."""
        kept = (t.index_select(0, keep) for t in (self.phrases, self.lengths, self.owner, self.weight, self.real))
        return replace(self, **dict(zip(("phrases", "lengths", "owner", "weight", "real"), kept, strict=True)))


@dataclass(frozen=True)
class TermState:
    """Where each beam (or candidate) stands: A sentences x K of them."""

    ends: Tensor  # (A, K, P, L + 1) bool: the output ends with the first k pieces of phrase p (k = 0: always)
    met: Tensor  # (A, K, J) bool: constraint j is met (padding: always)

    @classmethod
    def start(cls, terms: Terms, beam_size: int) -> TermState:
        sentences, phrases, pieces = terms.phrases.shape
        ends = torch.zeros(sentences, beam_size, phrases, pieces + 1, dtype=torch.bool, device=terms.phrases.device)
        ends[..., 0] = True
        return cls(ends, (~terms.real).unsqueeze(1).expand(-1, beam_size, -1).clone())

    def take(self, index: Tensor) -> TermState:
        """The states of beams `index` (A, K') of each sentence."""
        return TermState(_along(self.ends, index), _along(self.met, index))

    def select(self, keep: Tensor) -> TermState:
        """The states of the sentences `keep` (A',)."""
        return TermState(self.ends.index_select(0, keep), self.met.index_select(0, keep))

    def unmet(self, terms: Terms, sentence: int, *, beam: int) -> tuple[int, ...]:
        """The indices of the constraints that beam `beam` of active sentence `sentence` has not met."""
        missing = terms.real[sentence] & ~self.met[sentence, beam]
        return tuple(missing.nonzero().flatten().tolist())


def advance(terms: Terms, state: TermState, *, token: Tensor) -> TermState:
    """The state after each beam of `state` (A, C) appends `token` (A, C)."""
    sentences, count = token.shape
    length = terms.lengths[:, None, :, None].expand(sentences, count, -1, 1)  # (A, C, P, 1)
    whole = state.ends.gather(3, length).squeeze(3) & terms.lengths.gt(0).unsqueeze(1)  # (A, C, P) a phrase just produced
    ended = whole & ~terms.continues_word[token].unsqueeze(2)  # ... and now followed by a word boundary
    met_now = (ended.unsqueeze(3) & terms.owner.unsqueeze(1)).any(2)  # (A, C, J)
    if terms.in_order:
        met_now &= _first_unmet(state.met)
    matches = terms.phrases.unsqueeze(1).eq(token[:, :, None, None])  # (A, C, P, L)
    ends = torch.cat([state.ends[..., :1], state.ends[..., :-1] & matches], dim=3)
    return TermState(ends, state.met | met_now)


def hold_end(terms: Terms, state: TermState, *, log_probs: Tensor, at_limit: Tensor, eos_id: int) -> Tensor:
    """log_probs (A, K, V), changed in place: end-of-sentence impossible for every beam that would
    end with a constraint unmet, except in sentences at their output cap (at_limit (A,))."""
    eos = torch.full(state.met.shape[:2], eos_id, dtype=torch.long, device=log_probs.device)
    blocked = ~advance(terms, state, token=eos).met.all(2) & ~at_limit.unsqueeze(1)  # (A, K)
    log_probs[:, :, eos_id] = log_probs[:, :, eos_id].masked_fill(blocked, float("-inf"))
    return log_probs


def allocate(terms: Terms, state: TermState, *, totals: Tensor) -> tuple[Tensor, Tensor, Tensor, TermState]:
    """The candidate extensions of the beams, in the order the beam is filled.

    totals (A, K, V): each beam's total log-probability after each token. Returns scores, beam
    index and token (A, C) and the candidates' states; impossible and repeated candidates come last.
    """
    sentences, beam_size, vocab = totals.shape
    best_scores, best_index = totals.view(sentences, -1).topk(2 * beam_size, dim=1)  # (A, 2K)
    row_scores, row_tokens = totals.max(dim=2)  # (A, K)
    boundary_scores, boundary_tokens = totals.masked_fill(terms.continues_word, float("-inf")).max(dim=2)  # (A, K)
    pieces = _next_pieces(terms, state)  # (A, K, P)
    piece_scores = totals.gather(2, pieces.clamp(min=0)).masked_fill(pieces.lt(0), float("-inf"))
    beams = torch.arange(beam_size, device=totals.device).expand(sentences, -1)  # (A, K)
    scores = torch.cat([best_scores, row_scores, boundary_scores, piece_scores.flatten(1)], dim=1)  # (A, C)
    beam = torch.cat([best_index // vocab, beams, beams, beams.repeat_interleave(pieces.size(2), dim=1)], dim=1)
    token = torch.cat([best_index % vocab, row_tokens, boundary_tokens, pieces.flatten(1)], dim=1)
    scores = _without_repeats(scores, beam * vocab + token)
    moved = advance(terms, state.take(beam), token=token)
    order = _allocation_order(scores, _bank(terms, moved), (beam_size + 1) // 2, terms.scale**2)
    return scores.gather(1, order), beam.gather(1, order), token.gather(1, order), moved.take(order)


def _next_pieces(terms: Terms, state: TermState) -> Tensor:
    """(A, K, P): the piece each beam needs next for each phrase of an open constraint; -1 for none."""
    depth = _depth(state)  # (A, K, P)
    table = terms.phrases.unsqueeze(1).expand(-1, depth.size(1), -1, -1)  # (A, K, P, L)
    piece = table.gather(3, depth.clamp(max=table.size(3) - 1).unsqueeze(3)).squeeze(3)
    is_open = (_open(terms, state).unsqueeze(2) & terms.owner.unsqueeze(1)).any(3) & depth.lt(terms.lengths.unsqueeze(1))
    return piece.masked_fill(~is_open, -1)


def _bank(terms: Terms, state: TermState) -> Tensor:
    """(A, C): each candidate's progress: the pieces of the constraints it has met, then (to break
    ties) the pieces of open constraints it is in the middle of. Met pieces come first, so a beam
    that merely ends with a phrase's first piece, again and again, never stands in for one that met
    another constraint."""
    met = torch.where(state.met, terms.weight.unsqueeze(1), 0).sum(2)  # (A, C)
    under_way = ((_depth(state).unsqueeze(3) * terms.owner.unsqueeze(1)).amax(2) * _open(terms, state)).sum(2)  # (A, C)
    return met * terms.scale + under_way


def _allocation_order(scores: Tensor, bank: Tensor, natural: int, top: int) -> Tensor:
    """(A, C) candidate order: first the `natural` best by score, whatever their bank (the beam the
    model would keep on its own), then each bank's best (highest bank first), each bank's second...;
    impossible candidates (-inf) last. Banks are below `top`."""
    count = bank.size(1)
    position = torch.arange(count, device=bank.device).expand_as(bank)
    by_score = scores.argsort(dim=1, descending=True, stable=True)
    grouped = by_score.gather(1, bank.gather(1, by_score).argsort(dim=1, descending=True, stable=True))  # by bank, then score
    group_bank = bank.gather(1, grouped)
    starts = torch.ones_like(group_bank, dtype=torch.bool)
    starts[:, 1:] = group_bank[:, 1:] != group_bank[:, :-1]
    rank = torch.empty_like(position).scatter_(1, grouped, position - torch.where(starts, position, 0).cummax(dim=1).values)
    key = rank * top + (top - 1 - bank)  # round-robin over the banks
    score_rank = torch.empty_like(position).scatter_(1, by_score, position)
    key = torch.where(score_rank < natural, score_rank - natural, key).masked_fill(scores.isneginf(), count * top)
    return key.argsort(dim=1, stable=True)


def _without_repeats(scores: Tensor, key: Tensor) -> Tensor:
    """scores (A, C) with -inf on every candidate whose key (beam x token) came earlier in its row."""
    ordered, order = key.sort(dim=1, stable=True)
    repeat = torch.zeros_like(ordered, dtype=torch.bool)
    repeat[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return scores.masked_fill(torch.zeros_like(repeat).scatter(1, order, repeat), float("-inf"))


def _depth(state: TermState) -> Tensor:
    """(A, C, P): the most pieces of each phrase the output ends with."""
    return (state.ends * torch.arange(state.ends.size(3), device=state.ends.device)).amax(3)


def _open(terms: Terms, state: TermState) -> Tensor:
    """(A, C, J): constraints that may progress: every unmet one, or in order the first unmet."""
    return _first_unmet(state.met) if terms.in_order else ~state.met


def _first_unmet(met: Tensor) -> Tensor:
    unmet = ~met
    return unmet & unmet.long().cumsum(dim=-1).eq(1)


def _along(tensor: Tensor, index: Tensor) -> Tensor:
    """tensor (A, K, ...) gathered along dim 1 by index (A, K')."""
    shape = (*index.shape, *tensor.shape[2:])
    return tensor.gather(1, index.view(*index.shape, *([1] * (tensor.dim() - 2))).expand(shape))
