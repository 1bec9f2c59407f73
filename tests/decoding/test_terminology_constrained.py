"""Lexically constrained beam search, driven by a stub model whose next-token probabilities depend
on the previous token only (a table written by hand, or drawn at random)."""

from __future__ import annotations

import torch
from torch import Tensor

from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from mtkit.decoding.search import Hypothesis, SearchOptions, beam_search
from mtkit.decoding.step_rules import StepRules
from mtkit.decoding.terminology.constrained import TermRequest, Terms
from mtkit.models.base import DecoderState, EncoderDecoder

# ids 0-3 are pad, unk, bos, eos; then "▁a" "▁b" "▁c" "d" "▁e" "." (only "d" continues a word)
A, B, C, D, E, DOT = 4, 5, 6, 7, 8, 9
VOCAB = 10
CONTINUES = tuple(token == D for token in range(VOCAB))


class Bigram(EncoderDecoder):
    """log P(next | previous token), from `table` (V, V) of logits; every source reads the same table."""

    def __init__(self, table: Tensor) -> None:
        super().__init__()
        self.table = table.log_softmax(dim=1)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return src.float().unsqueeze(-1)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, state: DecoderState | None = None
    ) -> tuple[Tensor, DecoderState | None]:
        assert state is not None
        prefix = torch.cat([state.get("prefix", tgt.new_empty(tgt.size(0), 0)), tgt], dim=1)
        return self.table[tgt[:, -1]].unsqueeze(1), {"prefix": prefix}

    def log_prob(self, tokens: list[int]) -> float:
        """The model's log-probability of an output (EOS included)."""
        path = [BOS_ID, *tokens, EOS_ID]
        return float(sum(self.table[a, b] for a, b in zip(path, path[1:], strict=False)))


def hand_model(**preferences: dict[int, float]) -> Bigram:
    """A table where every content token and EOS have a little probability, and `preferences`
    (keyed by the previous token's name, "start" for BOS) add weight to some next tokens."""
    weights = torch.full((VOCAB, VOCAB), 0.01)
    weights[:, [PAD_ID, BOS_ID, 1]] = 0.0
    names = {"start": BOS_ID, "a": A, "b": B, "c": C, "d": D, "e": E, "dot": DOT}
    for name, row in preferences.items():
        for token, weight in row.items():
            weights[names[name], token] = weight
    return Bigram(weights.clamp(min=1e-12).log())


# Without constraints this model says "▁a ▁b ." and stops.
PLAIN = {"start": {A: 5.0}, "a": {B: 5.0}, "b": {DOT: 5.0}, "dot": {EOS_ID: 5.0}, "c": {D: 5.0}, "e": {EOS_ID: 2.0}}


def search(
    model: Bigram,
    constraints: list[list[list[int]]] | None,
    beam: int = 4,
    nbest: int = 1,
    cap: int = 10,
    in_order: bool = False,
    steer: StepRules | None = None,
    sources: int = 1,
    per_source: list[list[list[list[int]]]] | None = None,
) -> list[list[Hypothesis]]:
    given = per_source if per_source is not None else [constraints or []] * sources
    src = torch.tensor([[4 + n, EOS_ID] for n in range(len(given))])
    terms = None
    if any(given):
        terms = Terms.build(TermRequest(constraints=given, continues_word=CONTINUES, in_order=in_order), torch.device("cpu"))
    caps = torch.full((len(given),), cap)
    return beam_search(
        model,
        src,
        src_mask=src.ne(PAD_ID),
        max_len=caps,
        options=SearchOptions(beam=beam, nbest=nbest),
        step_rules=steer,
        terms=terms,
    )


def confirmed(tokens: list[int], phrase: list[int]) -> list[int]:
    """Where phrase is met: the positions of the word boundaries (not "d", or the end) that follow it."""
    found = []
    for start in range(len(tokens) - len(phrase) + 1):
        end = start + len(phrase)
        if tokens[start:end] == phrase and not CONTINUES[tokens[end] if end < len(tokens) else EOS_ID]:
            found.append(end)
    return found


def contains(tokens: list[int], phrase: list[int]) -> bool:
    """phrase appears in tokens and is followed by a word boundary (not "d") or the end."""
    return bool(confirmed(tokens, phrase))


def test_without_constraints_the_model_says_a_b_dot():
    assert search(hand_model(**PLAIN), None)[0][0].tokens == [A, B, DOT]


def test_a_term_the_model_would_never_choose_is_included_and_scored_by_the_model():
    model = hand_model(**PLAIN)
    best = search(model, [[[E]]])[0][0]
    assert contains(best.tokens, [E]) and best.unmet == ()
    assert abs(best.log_prob - model.log_prob(best.tokens)) < 1e-4


def test_an_interrupted_phrase_completes():
    # after "▁c" the model wants "▁a" (it would interrupt "▁c d"), and "d" is unlikely everywhere
    model = hand_model(**{**PLAIN, "c": {A: 5.0}})
    best = search(model, [[[C, D]]])[0][0]
    assert contains(best.tokens, [C, D]), best.tokens


def test_a_phrase_must_end_at_a_word_boundary():
    # after "▁c" the model wants "d": "▁c d" is the word "▁cd", which does not meet the term "▁c"
    model = hand_model(**PLAIN)
    best = search(model, [[[C]]])[0][0]
    assert contains(best.tokens, [C]), best.tokens


def test_of_two_alternatives_the_likelier_is_taken():
    model = hand_model(**{**PLAIN, "start": {A: 5.0, C: 0.5, E: 0.05}, "c": {B: 5.0}})
    best = search(model, [[[E], [C]]])[0][0]
    assert contains(best.tokens, [C]) and E not in best.tokens, best.tokens


def test_given_order_is_respected_and_any_order_is_not_forced():
    # the model prefers "▁c" early and "▁e" late
    model = hand_model(**{**PLAIN, "start": {C: 1.0, A: 5.0}, "b": {E: 0.5, DOT: 5.0}})
    free = search(model, [[[E]], [[C]]])[0][0].tokens
    ordered = search(model, [[[E]], [[C]]], in_order=True)[0][0].tokens
    assert contains(free, [E]) and contains(free, [C]) and free.index(C) < free.index(E), free
    assert contains(ordered, [E]) and contains(ordered, [C]) and ordered.index(E) < ordered.index(C), ordered


def test_every_nbest_entry_meets_every_constraint():
    model = hand_model(**PLAIN)
    found = search(model, [[[E]], [[C, D], [B]]], beam=5, nbest=5)[0]
    assert len(found) == 5
    for hypothesis in found:
        assert contains(hypothesis.tokens, [E]) and (contains(hypothesis.tokens, [C, D]) or contains(hypothesis.tokens, [B]))
        assert hypothesis.unmet == ()
        assert abs(hypothesis.log_prob - model.log_prob(hypothesis.tokens)) < 1e-4


def test_a_cap_too_short_returns_the_hypothesis_flagged():
    found = search(hand_model(**PLAIN), [[[E]], [[C, D]]], cap=2)[0][0]
    assert found.tokens and len(found.tokens) <= 2
    assert set(found.unmet) <= {0, 1} and found.unmet


def random_model(seed: int, scale: float = 3.0) -> Bigram:
    """Random bigram logits, with end-of-sentence likely enough that outputs end before the cap."""
    logits = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale
    logits[:, EOS_ID] += scale
    return Bigram(logits)


def meets(hypothesis: Hypothesis, constraints: list[list[list[int]]], in_order: bool = False) -> bool:
    """Every constraint is met; in order: each one confirmed after the one before it."""
    last = -1
    for alternatives in constraints:
        places = [end for phrase in alternatives for end in confirmed(hypothesis.tokens, phrase) if end > last or not in_order]
        if not places:
            return False
        last = min(places)
    return True


def test_mixed_batch_leaves_unconstrained_lines_unchanged_and_permutes_with_the_batch():
    model = random_model(0, scale=2.0)
    plain = search(model, None, beam=4, nbest=4, cap=20, sources=3)
    given = [[], [[[E]], [[C, D]]], [[[B, A]]]]
    mixed = search(model, None, beam=4, nbest=4, cap=20, per_source=given)
    assert [(h.tokens, h.log_prob) for h in mixed[0]] == [(h.tokens, h.log_prob) for h in plain[0]]
    permuted = search(model, None, beam=4, nbest=4, cap=20, per_source=[given[2], given[0], given[1]])
    for a, b in ((0, 1), (1, 2), (2, 0)):
        assert [(h.tokens, h.log_prob) for h in mixed[a]] == [(h.tokens, h.log_prob) for h in permuted[b]]
    for constraints, hypotheses in zip(given, mixed, strict=True):
        assert hypotheses[0].unmet == () and meets(hypotheses[0], constraints), hypotheses[0]
        for hypothesis in hypotheses:
            assert meets(hypothesis, constraints) == (hypothesis.unmet == ()), hypothesis


def test_random_models_get_their_terms_and_flag_only_what_the_cap_cut():
    terms = [[[E]], [[C, D], [A, B]], [[DOT]]]
    for seed in range(20):
        model = random_model(seed)
        for in_order in (False, True):
            found = search(model, terms, beam=6, nbest=3, cap=16, in_order=in_order)[0]
            assert found[0].unmet == () and meets(found[0], terms, in_order), (seed, in_order, found[0])
            for hypothesis in found:
                assert meets(hypothesis, terms, in_order) == (hypothesis.unmet == ()), (seed, in_order, hypothesis)
                assert abs(hypothesis.log_prob - model.log_prob(hypothesis.tokens)) < 1e-3


def test_with_a_prefix_and_ngram_blocking():
    model = hand_model(**PLAIN)
    steer = StepRules([[C, A]], 2, device=torch.device("cpu"))
    best = search(model, [[[E]]], steer=steer)[0][0]
    assert best.tokens[:2] == [C, A] and contains(best.tokens, [E])
