"""Greedy and beam search over the encode / decode / reorder_state contract, and the length penalty.

Search never asks which architecture it drives: it encodes once, then decodes incrementally, one
token per step, starting from an empty `state` dict. `StepRules` (prefixes, n-gram blocking)
steer each step's log-probabilities; greedy search may draw its tokens (`pick`) instead of taking
the most probable one. Finished sentences leave the active batch at
once; `model.reorder_state` both shrinks the decoder cache and reorders beams.

A hypothesis never holds more than `max_len` tokens: once it holds `max_len`, its next token is
forced to be EOS and the EOS log-probability is added, so every `log_prob` is the log-probability of
a complete sequence ending in EOS, and scores of forced and natural endings are comparable.

Beam search also takes lexical constraints (`mtkit.decoding.terminology.constrained.Terms`): terms every hypothesis
must contain, with dynamic beam allocation; a hypothesis that reaches its output cap without them is
returned with `Hypothesis.unmet` naming them, and ranks after every one that has them all.

Both searches take their settings whole, as one `SearchOptions` (beam, nbest, length penalty, the ids
never emitted, and an optional `stop`, asked before every step: once it says True the search ends
with `SearchStopped`, the server's way to free a worker whose client has gone or timed out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from mtkit.decoding.options import Sampling
from mtkit.decoding.step_rules import StepRules
from mtkit.decoding.terminology.constrained import Terms, TermState, allocate, hold_end
from mtkit.errors import MtkitError
from mtkit.models.base import DecoderState, EncoderDecoder, padding_hint

NEVER_EMITTED = (PAD_ID, BOS_ID)
Stop = Callable[[], bool]  # asked before every step; True ends the search


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """The search layer's own options: what an engine's search is asked for, every value decided.

    Built only by `Translator.search_options`, from the call's `Decoding` with the recipe's
    `DecodeConfig` filling what the call leaves open (None), and checked against the engine; tests
    build it directly. Fields shared with `Decoding` keep its names.
    """

    beam: int = 1
    nbest: int = 1
    length_penalty: float = 0.0  # the exponent: scores are log_prob / length ** length_penalty
    sampling: Sampling | None = None
    no_repeat_ngram: int = 0
    alignment_layer: int | None = None  # give each hypothesis its `links`, from this decoder layer (None: no links)
    stop: Stop | None = field(default=None, compare=False, repr=False)  # asked before each step (PyTorch) or batch
    constraints_in_order: bool = False  # lexical constraints in the order given
    never: tuple[int, ...] = NEVER_EMITTED  # ids no output holds: PAD, BOS and the model's tags
    forced_lead: int = 0  # each prefix's first tokens forced at log-probability 0: a target-language code
    shortlist: bool = False  # search over the engine's vocabulary shortlist (`mtkit.decoding.shortlist`)

    @property
    def width(self) -> int:
        """Rows searched per source: the beam, or the number of samples."""
        return self.nbest if self.sampling is not None else self.beam


GREEDY = SearchOptions()  # greedy search, scores as total log-probabilities


class SearchStopped(Exception):
    """The search's `stop` said True between two steps; nothing was found."""


@dataclass(kw_only=True)
class Hypothesis:
    """One finished translation."""

    tokens: list[int]  # output ids, without BOS and without the final EOS
    score: float  # length-normalised score used for ranking
    log_prob: float  # total log-probability, EOS included
    links: list[int] | None = None  # per output token, the source token it attends to most (when asked)
    source_links: list[int] | None = None  # per source token (EOS left out), the output token that attends to it most
    unmet: tuple[int, ...] = ()  # the lexical constraints it lacks (it reached its output cap first)


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """`length ** alpha`, the divisor of a log-probability; `length` counts the EOS (as in fairseq).

    alpha 0 ranks by total log-probability; alpha 1 by the average log-probability per token.
    """
    return length**alpha


def beam_step(log_probs: Tensor, running: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The best 2K one-token extensions of K beams, over beam x vocabulary (its inputs are left as they are).

    log_probs (N, K, V) next-token log-probabilities; running (N, K) total log-probability of each beam.
    Returns scores, beam_index and token, each (N, 2K), sorted by score (descending). Twice K
    candidates guarantee K that do not end in EOS, since each beam offers a single EOS candidate.
    """
    return _best_candidates(running.unsqueeze(2) + log_probs)


def _best_candidates(candidates: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`beam_step` on the candidates' total scores (N, K, V)."""
    batch, beam_size, vocab_size = candidates.shape
    scores, flat_index = candidates.view(batch, beam_size * vocab_size).topk(2 * beam_size, dim=1)  # (N, 2K)
    return scores, flat_index // vocab_size, flat_index % vocab_size


@torch.inference_mode()
def greedy_search(
    model: EncoderDecoder,
    src: Tensor,
    *,
    src_mask: Tensor,
    max_len: Tensor,
    options: SearchOptions = GREEDY,
    step_rules: StepRules | None = None,
    pick: Callable[[Tensor], Tensor] | None = None,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    src_padded: bool | None = None,
) -> list[Hypothesis]:
    """Pick the most probable token at every step; one hypothesis per sentence, in input order.

    src (B, S) ids; src_mask (B, S) True on real tokens; max_len (B,) most output tokens, EOS excluded;
    src_padded: whether some source row is padded, if known (`mtkit.models.base`).
    Of `options`, `length_penalty` only sets `Hypothesis.score` (as in `beam_search`; the tokens do not depend
    on it), `stop` is asked before each step and no output holds a token of `never`.
    `pick` maps log-probabilities (A, V) to the next tokens (A,) instead of argmax (sampling).
    """
    alpha, stop, constraints = options.length_penalty, options.stop, step_rules
    batch_size = src.size(0)
    banned = torch.tensor(list(options.never), device=src.device)
    memory = model.encode(src, src_mask, **padding_hint(src_padded=src_padded))  # (B, S, D)
    sentence = torch.arange(batch_size, device=src.device)  # (A,) input index of each active sentence
    tokens = torch.full((batch_size, 1), bos_id, dtype=torch.long, device=src.device)  # (A, 1 + step)
    log_prob = torch.zeros(batch_size, device=src.device)  # (A,)
    state: DecoderState = {}
    results: list[Hypothesis | None] = [None] * batch_size
    step, earliest_cap = 0, _earliest_cap(max_len)
    while sentence.numel() > 0:
        _check(stop)
        log_probs, state = _next_log_probs(model, tokens, memory, src_mask, state, banned, src_padded)  # (A, V)
        if constraints is not None:
            log_probs = constraints.apply(log_probs, tokens, sentence=sentence, step=step)
        next_token = log_probs.argmax(dim=1) if pick is None else pick(log_probs)  # (A,)
        next_token = _eos_at_cap(next_token, max_len, step=step, earliest_cap=earliest_cap, eos_id=eos_id)
        log_prob = log_prob + log_probs.gather(1, next_token.unsqueeze(1)).squeeze(1)
        tokens = torch.cat([tokens, next_token.unsqueeze(1)], dim=1)
        done = next_token.eq(eos_id)  # (A,)
        if done.any():
            _record_greedy(results, sentence[done], tokens[done], log_prob[done], alpha)
            keep = (~done).nonzero().flatten()  # (A',)
            sentence, max_len, tokens, log_prob = (x.index_select(0, keep) for x in (sentence, max_len, tokens, log_prob))
            memory, src_mask = memory.index_select(0, keep), src_mask.index_select(0, keep)
            state = model.reorder_state(state, keep)
            earliest_cap = _earliest_cap(max_len)
        step += 1
    return [result for result in results if result is not None]  # all set: max_len ends every sentence


def _eos_at_cap(next_token: Tensor, max_len: Tensor, *, step: int, earliest_cap: int, eos_id: int) -> Tensor:
    """next_token (A,) with EOS in every sentence at its output cap max_len (A,); none is before `earliest_cap`."""
    return next_token if step < earliest_cap else next_token.masked_fill(max_len <= step, eos_id)


def _record_greedy(results: list[Hypothesis | None], sentence: Tensor, tokens: Tensor, log_prob: Tensor, alpha: float) -> None:
    """The finished rows' hypotheses into `results`, all at once: their input indices (F,), tokens (F, 2 + step)
    from BOS to EOS, and total log-probabilities (F,)."""
    for index, row, total in zip(sentence.tolist(), tokens[:, 1:-1].tolist(), log_prob.tolist(), strict=True):
        results[index] = _hypothesis(row, total, alpha)


@dataclass
class _Beams:
    """The active part of a beam search: row `a * K + k` holds beam k of active sentence a."""

    sentence: Tensor  # (A,) input index of each active sentence
    max_len: Tensor  # (A,)
    num_finished: Tensor  # (A,) finished hypotheses so far
    running: Tensor  # (A, K) total log-probability of each beam
    tokens: Tensor  # (A*K, 1 + step) BOS and the tokens so far
    memory: Tensor  # (A*K, S, D)
    src_mask: Tensor  # (A*K, S)
    state: DecoderState
    terms: Terms | None = None  # lexical constraints of the active sentences
    marks: TermState | None = None  # (A, K) where each beam stands with them
    src_padded: bool | None = None  # some source row is padded (None: not known); dropping rows keeps it
    earliest_cap: int = 0  # min(max_len): no sentence reaches its output cap before this step


@torch.inference_mode()
def beam_search(
    model: EncoderDecoder,
    src: Tensor,
    *,
    src_mask: Tensor,
    max_len: Tensor,
    options: SearchOptions,
    step_rules: StepRules | None = None,
    terms: Terms | None = None,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    src_padded: bool | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search; per sentence (in input order) the `nbest` best hypotheses, best first.

    src (B, S) ids; src_mask (B, S) True on real tokens; max_len (B,) most output tokens, EOS excluded.
    Beams are ranked by total log-probability; finished hypotheses by `log_prob / length_penalty`.
    A sentence is finished once it holds `beam_size` finished hypotheses (fairseq's rule), reaches
    `max_len`, or has no beam left with a non-zero probability. With `terms`, hypotheses lacking a
    constraint (cut by the output cap) rank after all others. src_padded: as in `greedy_search`.
    """
    beam_size, alpha, nbest, stop, constraints = options.beam, options.length_penalty, options.nbest, options.stop, step_rules
    if beam_size < 1 or not 1 <= nbest <= beam_size:
        raise MtkitError(f"beam_size={beam_size}, nbest={nbest}: need beam_size >= 1 and 1 <= nbest <= beam_size")
    batch_size, device = src.size(0), src.device
    memory = model.encode(src, src_mask, **padding_hint(src_padded=src_padded))  # (B, S, D)
    beams = _start_beams(memory, src_mask, max_len=max_len, beam_size=beam_size, bos_id=bos_id, terms=terms)
    beams.src_padded = src_padded
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    banned, step = torch.tensor(list(options.never), device=device), 0
    while beams.sentence.numel() > 0:
        _check(stop)
        beams = _advance_beams(model, beams, step, alpha, eos_id, finished, constraints, banned)
        step += 1
    return [sorted(hypotheses, key=lambda h: (len(h.unmet), -h.score))[:nbest] for hypotheses in finished]


def _start_beams(
    memory: Tensor, src_mask: Tensor, *, max_len: Tensor, beam_size: int, bos_id: int, terms: Terms | None
) -> _Beams:
    """The first step's beams of memory (B, S, D): K rows a sentence, each BOS alone."""
    batch_size, device = memory.size(0), memory.device
    rows = torch.arange(batch_size, device=device).repeat_interleave(beam_size)  # (B*K,)
    # Only beam 0 is alive at the first step, so the K beams do not start as K copies.
    running = torch.full((batch_size, beam_size), float("-inf"), device=device)  # (B, K)
    running[:, 0] = 0.0
    return _Beams(
        sentence=torch.arange(batch_size, device=device),
        max_len=max_len,
        num_finished=torch.zeros(batch_size, dtype=torch.long, device=device),
        running=running,
        tokens=torch.full((batch_size * beam_size, 1), bos_id, dtype=torch.long, device=device),
        memory=memory.index_select(0, rows),  # (B*K, S, D)
        src_mask=src_mask.index_select(0, rows),  # (B*K, S)
        state={},
        terms=terms,
        marks=TermState.start(terms, beam_size) if terms is not None else None,
        earliest_cap=_earliest_cap(max_len),
    )


def _advance_beams(
    model: EncoderDecoder,
    beams: _Beams,
    step: int,
    alpha: float,
    eos_id: int,
    finished: list[list[Hypothesis]],
    constraints: StepRules | None,
    banned: Tensor,
) -> _Beams:
    """One beam-search step: extend, finalise EOS candidates, keep the best K, drop finished sentences."""
    active, beam_size = beams.running.shape
    log_probs, state = _beam_log_probs(model, beams, banned, step=step)  # (A*K, V)
    if constraints is not None:
        log_probs = constraints.apply(log_probs, beams.tokens, sentence=beams.sentence.repeat_interleave(beam_size), step=step)
    # (A,) sentences at their output cap; not computed (None) before the first cap, unless constraints need it
    at_limit = beams.max_len <= step if step >= beams.earliest_cap or beams.terms is not None else None
    log_probs = log_probs.view(active, beam_size, -1)  # (A, K, V)
    terms = beams.terms.fit(log_probs.size(2)) if beams.terms is not None else None
    if terms is not None and beams.marks is not None and at_limit is not None:
        log_probs = hold_end(terms, beams.marks, log_probs=log_probs, at_limit=at_limit, eos_id=eos_id)
    # The step's log-probabilities are this function's own: the totals are added in place (with a
    # vocabulary of 58,000 pieces, each pass over them costs about as much as a decoder layer).
    totals = (log_probs if at_limit is None else _force_eos(log_probs, at_limit, eos_id)).add_(beams.running.unsqueeze(2))
    if terms is not None and beams.marks is not None:
        scores, beam_index, token, marks = allocate(terms, beams.marks, totals=totals)  # (A, C) in allocation order
    else:
        (scores, beam_index, token), marks = _best_candidates(totals), None  # (A, 2K)
    rows = beam_index + torch.arange(0, active * beam_size, beam_size, device=token.device).unsqueeze(1)  # (A, C) beam rows

    # 1. As in fairseq, an EOS candidate is finalised only if it ranks among the top K.
    ends = token.eq(eos_id)  # (A, C)
    is_final = ends[:, :beam_size] & scores[:, :beam_size].isfinite()  # (A, K)
    _record_finished(finished, beams, rows, scores, is_final, alpha, (terms, marks) if terms is not None else None)
    num_finished = beams.num_finished + is_final.sum(dim=1)  # (A,)

    # 2. The best K candidates that do not end in EOS continue (a stable sort keeps score order).
    order = torch.sort(ends.int(), dim=1, stable=True).indices[:, :beam_size]  # (A, K)
    running, rows, token = scores.gather(1, order), rows.gather(1, order), token.gather(1, order)  # (A, K)
    done = (num_finished >= beam_size) | running.isneginf().all(dim=1)  # (A,)
    if at_limit is not None:
        done |= at_limit
    kept = _Beams(beams.sentence, beams.max_len, num_finished, running, beams.tokens, beams.memory, beams.src_mask, state)
    kept.terms, kept.marks = terms, marks.take(order) if marks is not None else None
    kept.src_padded, kept.earliest_cap = beams.src_padded, beams.earliest_cap
    return _without_finished(model, kept, rows, token, done)


def _beam_log_probs(model: EncoderDecoder, beams: _Beams, banned: Tensor, *, step: int) -> tuple[Tensor, DecoderState]:
    """Every beam's next-token log-probabilities (A*K, V) and the model's new state.

    At step 0 every beam holds BOS alone and only beam 0 of each sentence is alive, so the model decodes one row a
    sentence (the cross-attention's keys and values of a source are projected once, not K times), and its
    log-probabilities and state are repeated for the K beams.
    """
    if step > 0:
        return _next_log_probs(model, beams.tokens, beams.memory, beams.src_mask, beams.state, banned, beams.src_padded)
    beam_size = beams.running.size(1)
    first = torch.arange(0, beams.tokens.size(0), beam_size, device=beams.tokens.device)  # (A,) beam 0 of each sentence
    memory, src_mask = beams.memory.index_select(0, first), beams.src_mask.index_select(0, first)
    log_probs, state = _next_log_probs(model, beams.tokens[first], memory, src_mask, beams.state, banned, beams.src_padded)
    repeat = torch.arange(first.numel(), device=first.device).repeat_interleave(beam_size)  # (A*K,)
    return log_probs.index_select(0, repeat), model.reorder_state(state, repeat, keep_memory=True)


def _without_finished(model: EncoderDecoder, beams: _Beams, rows: Tensor, token: Tensor, done: Tensor) -> _Beams:
    """The next step's beams: each beam row `rows` (A, K) extended by `token` (A, K); the sentences `done` (A,)
    leave the batch, and the kept beams are reordered in every cached tensor."""
    beam_size = rows.size(1)
    if not done.any():  # the usual step: every sentence stays, only its beams move
        rows, token = rows.flatten(), token.flatten()  # (A*K,)
        return replace(
            beams,
            tokens=torch.cat([beams.tokens.index_select(0, rows), token.unsqueeze(1)], dim=1),  # (A*K, 2 + step)
            state=model.reorder_state(beams.state, rows, keep_memory=True),
        )
    keep = (~done).nonzero().flatten()  # (A',)
    rows, token = rows.index_select(0, keep).flatten(), token.index_select(0, keep).flatten()  # (A'*K,)
    offsets = (keep.unsqueeze(1) * beam_size + torch.arange(beam_size, device=keep.device)).flatten()  # (A'*K,)
    max_len = beams.max_len.index_select(0, keep)
    return _Beams(
        sentence=beams.sentence.index_select(0, keep),
        max_len=max_len,
        num_finished=beams.num_finished.index_select(0, keep),
        running=beams.running.index_select(0, keep),
        tokens=torch.cat([beams.tokens.index_select(0, rows), token.unsqueeze(1)], dim=1),  # (A'*K, 2 + step)
        memory=beams.memory.index_select(0, offsets),
        src_mask=beams.src_mask.index_select(0, offsets),
        state=model.reorder_state(beams.state, rows),
        terms=beams.terms.select(keep) if beams.terms is not None else None,
        marks=beams.marks.select(keep) if beams.marks is not None else None,
        src_padded=beams.src_padded,
        earliest_cap=_earliest_cap(max_len),
    )


def _earliest_cap(max_len: Tensor) -> int:
    """The first step at which a sentence of max_len (A,) reaches its output cap (0 when there is none)."""
    return int(max_len.min()) if max_len.numel() else 0


def _next_log_probs(
    model: EncoderDecoder,
    tokens: Tensor,
    memory: Tensor,
    src_mask: Tensor,
    state: DecoderState,
    banned: Tensor,
    src_padded: bool | None = None,
) -> tuple[Tensor, DecoderState]:
    """Feed the newest token of each row (rows, 1); float32 next-token log-probabilities (rows, V).

    The `banned` ids (PAD, BOS, target-language tags) are never emitted: their log-probabilities are
    set to -inf after the softmax, so every other token keeps the model's own log-probability (as
    `mtkit score` computes it).
    """
    logits, new_state = model.decode(
        tokens[:, -1:], memory, src_mask=src_mask, state=state, **padding_hint(src_padded=src_padded)
    )  # (rows, 1, V)
    assert new_state is not None, "incremental decoding must return a state dict"
    last = logits[:, -1]  # (rows, V)
    log_probs = torch.log_softmax(last if last.dtype == torch.float32 else last.float(), dim=-1)  # (rows, V), a new tensor
    return log_probs.index_fill_(1, banned, float("-inf")), new_state


def _force_eos(log_probs: Tensor, at_limit: Tensor, eos_id: int) -> Tensor:
    """log_probs (N, K, V), changed in place: every token but EOS made impossible in sentences at_limit (N,)."""
    rows = at_limit.nonzero().flatten()  # usually none: then nothing is touched
    if rows.numel():
        eos = log_probs[rows, :, eos_id]  # (R, K), a copy
        log_probs[rows] = float("-inf")
        log_probs[rows, :, eos_id] = eos
    return log_probs


def _record_finished(
    finished: list[list[Hypothesis]],
    beams: _Beams,
    rows: Tensor,
    scores: Tensor,
    is_final: Tensor,
    alpha: float,
    constrained: tuple[Terms, TermState] | None,
) -> None:
    """Append the candidates marked in is_final (A, K) to their sentence's hypotheses.

    rows and scores (A, C) give each candidate's beam row and total log-probability, `constrained`
    the terms and where each candidate stands with them; the loop runs over the finalised candidates only.
    """
    found = is_final.nonzero().tolist()  # [[active index, candidate], ...] in row-major order, as masks select
    if not found:
        return
    sentence = beams.sentence.tolist()
    beam_size = is_final.size(1)
    tokens = beams.tokens.index_select(0, rows[:, :beam_size][is_final])[:, 1:].tolist()  # (F, step) without BOS
    totals = scores[:, :beam_size][is_final].tolist()  # (F,)
    for (active_index, candidate), hypothesis_tokens, total in zip(found, tokens, totals, strict=True):
        hypothesis = _hypothesis(hypothesis_tokens, total, alpha)
        if constrained is not None:
            hypothesis.unmet = constrained[1].unmet(constrained[0], active_index, beam=candidate)
        finished[sentence[active_index]].append(hypothesis)


def _check(stop: Stop | None) -> None:
    if stop is not None and stop():
        raise SearchStopped


def _hypothesis(tokens: list[int], log_prob: float, alpha: float) -> Hypothesis:
    """A finished hypothesis; its length for the penalty counts the EOS."""
    return Hypothesis(tokens=tokens, score=log_prob / length_penalty(len(tokens) + 1, alpha), log_prob=log_prob)
