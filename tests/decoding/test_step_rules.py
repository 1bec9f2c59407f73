"""Prefixes, n-gram blocking and sampling, driven by stub models whose probabilities are written by hand."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from functools import partial

import pytest
import torch
from torch import Tensor

from mtkit.config import TEMPERATURE
from mtkit.data.tokenizer import EOS_ID
from mtkit.decoding.options import Sampling
from mtkit.decoding.sampling import draw
from mtkit.decoding.search import Hypothesis, SearchOptions, beam_search, greedy_search
from mtkit.decoding.step_rules import StepRules
from mtkit.errors import MtkitError
from mtkit.models.base import DecoderState, EncoderDecoder

A, B, C, D = 4, 5, 6, 7  # content tokens of the stubs' vocabulary (ids 0..7)
VOCAB_SIZE = 8

Table = Callable[[tuple[int, ...]], dict[int, float]]


def first_pick(prefix: tuple[int, ...]) -> dict[int, float]:
    """A draw of A (0.5), B (0.3) or C (0.2), then the end."""
    return {A: 0.5, B: 0.3, C: 0.2} if not prefix else {EOS_ID: 1.0}


def loves_repeating(prefix: tuple[int, ...]) -> dict[int, float]:
    """A B A B ... is always the most probable way on; C, D and the end come after."""
    favourite = B if prefix and prefix[-1] == A else A
    others = {t: p for t, p in ((A, 0.1), (B, 0.1), (C, 0.22), (D, 0.08)) if t != favourite}
    return {favourite: 0.55, **others, EOS_ID: 0.05}


def counts_up(prefix: tuple[int, ...]) -> dict[int, float]:
    """A B C D, then the end (every token possible): no n-gram of the best output repeats."""
    if len(prefix) >= 4:
        return {EOS_ID: 0.9, A: 0.04, B: 0.02, C: 0.02, D: 0.02}
    following = (A, B, C, D)[len(prefix)]
    return {following: 0.84, **{t: 0.04 for t in (A, B, C, D, EOS_ID) if t != following}}


class TableModel(EncoderDecoder):
    """Next-token probabilities from `table(prefix)`; the state keeps the prefix as a tensor."""

    def __init__(self, table: Table) -> None:
        super().__init__()
        self.table = table

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return src.float().unsqueeze(-1)  # (B, S, 1)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, state: DecoderState | None = None
    ) -> tuple[Tensor, DecoderState | None]:
        assert state is not None
        prefix = torch.cat([state.get("prefix", tgt.new_empty(tgt.size(0), 0)), tgt], dim=1)  # (B, t)
        probabilities = torch.zeros(tgt.size(0), VOCAB_SIZE)
        for row, tokens in enumerate(prefix.tolist()):
            for token, probability in self.table(tuple(tokens[1:])).items():
                probabilities[row, token] += probability
        return probabilities.log().unsqueeze(1), {"prefix": prefix}  # (B, 1, V)


def batch(rows: int) -> tuple[Tensor, dict[str, Tensor]]:
    """A source of `rows` rows, and its mask and output cap by name, as search takes them."""
    src = torch.full((rows, 2), A)
    return src, {"src_mask": src.bool(), "max_len": torch.full((rows,), 12)}


def greedy(table: Table, rows: int = 1, constraints: StepRules | None = None, pick=None) -> list[Hypothesis]:
    src, options = batch(rows)
    return greedy_search(TableModel(table), src, **options, step_rules=constraints, pick=pick)


def beam(table: Table, rows: int = 1, constraints: StepRules | None = None) -> list[Hypothesis]:
    """The best of a beam of 3 (ranked by log-probability per token), per row."""
    src, options = batch(rows)
    beam_options = SearchOptions(beam=3, length_penalty=1.0)
    found = beam_search(TableModel(table), src, **options, options=beam_options, step_rules=constraints)
    return [hypotheses[0] for hypotheses in found]


def sampled_first_tokens(sampling: Sampling, rows: int = 4000) -> Counter:
    generator = torch.Generator().manual_seed(sampling.seed)
    found = greedy(first_pick, rows, pick=partial(draw, sampling=sampling, generator=generator))
    return Counter(h.tokens[0] for h in found)


def model_log_prob(table: Table, tokens: list[int]) -> float:
    return sum(math.log(table(tuple(tokens[:n]))[token]) for n, token in enumerate([*tokens, EOS_ID]))


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        (Sampling(), {A: 0.5, B: 0.3, C: 0.2}),
        (Sampling(top_k=2), {A: 0.625, B: 0.375}),
        (Sampling(top_p=0.7), {A: 0.625, B: 0.375}),  # A alone holds 0.5 < 0.7; A and B reach it
        (Sampling(top_p=0.4), {A: 1.0}),
        (Sampling(temperature=0.5), {A: 0.25 / 0.38, B: 0.09 / 0.38, C: 0.04 / 0.38}),  # p ** 2, renormalised
    ],
)
def test_sampling_frequencies_match_the_distribution(sampling, expected):
    counts = sampled_first_tokens(sampling)
    assert set(counts) == set(expected)  # top-k and top-p never emit a token outside their set
    for token, probability in expected.items():
        assert counts[token] / 4000 == pytest.approx(probability, abs=0.03)


def test_tokens_that_never_end_an_output_are_never_drawn():
    log_probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log().expand(500, 4)
    drawn = draw(log_probs, Sampling(temperature=5.0), generator=torch.Generator().manual_seed(0), never=(0, 1))
    assert set(drawn.tolist()) == {2, 3}


def test_a_sample_is_scored_with_the_models_own_log_probability():
    generator = torch.Generator().manual_seed(3)
    pick = partial(draw, sampling=Sampling(temperature=0.3), generator=generator)
    for hypothesis in greedy(first_pick, 20, pick=pick):
        assert hypothesis.log_prob == pytest.approx(model_log_prob(first_pick, hypothesis.tokens), rel=1e-6)


def test_the_same_seed_gives_the_same_samples_and_another_seed_others():
    def tokens(seed: int) -> list[list[int]]:
        pick = partial(draw, sampling=Sampling(seed=seed), generator=torch.Generator().manual_seed(seed))
        return [h.tokens for h in greedy(loves_repeating, 30, pick=pick)]

    assert tokens(7) == tokens(7)
    assert tokens(7) != tokens(8)


@pytest.mark.parametrize("text", ["topk:0", "topk:x", "topp:0", "topp:1.5", "nucleus:0.9", "full:3"])
def test_a_bad_sampling_option_is_one_clear_error(text):
    with pytest.raises(MtkitError, match="give topk:K"):
        Sampling.parse(text)
    with pytest.raises(MtkitError, match="--temperature 0"):
        Sampling.parse("full", temperature=0)


@pytest.mark.parametrize(
    ("temperature", "seed", "message"),
    [
        (float("nan"), 0, "--temperature nan"),
        (float("inf"), 0, "--temperature inf"),
        (1e-300, 0, r"--temperature 1e-300: give a number in \[0.01, 100\]"),
        (100.5, 0, r"--temperature 100.5: give a number in \[0.01, 100\]"),
        (1.0, 2**70, "--seed 1180591620717411303424"),
        (1.0, -1, "--seed -1"),
    ],
)
def test_temperatures_out_of_range_and_seeds_outside_64_bits_are_refused(temperature, seed, message):
    with pytest.raises(MtkitError, match=message):
        Sampling.parse("topk:5", temperature, seed=seed)
    assert Sampling.parse("topk:5", 1.0, seed=2**64 - 1).seed == 2**64 - 1


def test_the_temperatures_at_the_bounds_draw_real_tokens():
    log_probs = torch.tensor([[0.0, -1e4, float("-inf"), -103.0]]).log_softmax(dim=1)  # (1, V): a certain token first
    for bound in (TEMPERATURE.low, TEMPERATURE.high):
        drawn = draw(log_probs, Sampling.parse("full", bound), generator=torch.Generator().manual_seed(0))
        assert drawn.tolist()[0] in (0, 1, 3)  # never the impossible token


def test_sampling_options_parse():
    assert Sampling.parse("topk:10", 0.7, seed=3) == Sampling(top_k=10, temperature=0.7, seed=3)
    assert Sampling.parse("topp:0.9") == Sampling(top_p=0.9)
    assert Sampling.parse("full") == Sampling()


def repeated_ngrams(tokens: list[int], size: int) -> list[tuple[int, ...]]:
    ngrams = Counter(tuple(tokens[i : i + size]) for i in range(len(tokens) - size + 1))
    return [ngram for ngram, count in ngrams.items() if count > 1]


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("search", [greedy, beam])
def test_no_repeat_ngram_blocks_every_repeat_of_a_stub_that_loves_repeating(search, size):
    [plain] = search(loves_repeating)
    assert repeated_ngrams(plain.tokens, size)
    [blocked] = search(loves_repeating, constraints=StepRules.build(None, size, device=torch.device("cpu")))
    assert len(blocked.tokens) >= 2 and not repeated_ngrams(blocked.tokens, size)
    assert blocked.log_prob == pytest.approx(model_log_prob(loves_repeating, blocked.tokens), rel=1e-6)


def test_no_repeat_ngram_changes_nothing_where_nothing_repeats():
    constraints = StepRules.build(None, 2, device=torch.device("cpu"))
    for search in (greedy, beam):
        [plain], [blocked] = search(counts_up), search(counts_up, constraints=constraints)
        assert blocked.tokens == plain.tokens == [A, B, C, D]
        assert blocked.log_prob == pytest.approx(plain.log_prob, rel=1e-6)


@pytest.mark.parametrize("search", [greedy, beam])
def test_outputs_start_with_their_prefix_and_an_empty_prefix_changes_nothing(search):
    prefixes = [[D, C], [], [C]]
    found = search(counts_up, 3, StepRules.build(prefixes, 0, device=torch.device("cpu")))
    assert found[0].tokens[:2] == [D, C] and found[2].tokens[:1] == [C]
    [plain] = search(counts_up, 1)
    assert found[1].tokens == plain.tokens and found[1].log_prob == pytest.approx(plain.log_prob)
    for hypothesis in found:  # forced tokens keep the model's own probability
        assert hypothesis.log_prob == pytest.approx(model_log_prob(counts_up, hypothesis.tokens), rel=1e-6)


def test_a_prefix_is_forced_even_where_it_repeats_a_blocked_ngram():
    constraints = StepRules.build([[A, A, A]], 1, device=torch.device("cpu"))
    [hypothesis] = greedy(loves_repeating, constraints=constraints)
    assert hypothesis.tokens[:3] == [A, A, A]
    assert A not in hypothesis.tokens[3:]


def test_nothing_to_constrain_builds_nothing():
    assert StepRules.build(None, 0, device=torch.device("cpu")) is None
    assert StepRules.build([[], []], 0, device=torch.device("cpu")) is None
