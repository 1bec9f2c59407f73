"""Greedy and beam search, driven by a stub model whose probabilities are written by hand, and a Transformer's
cached decoding against decoding the whole prefix at every step."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from mtkit.decoding.search import (
    Hypothesis,
    SearchOptions,
    SearchStopped,
    beam_search,
    beam_step,
    greedy_search,
    length_penalty,
)
from mtkit.errors import MtkitError
from mtkit.models.base import DecoderState, EncoderDecoder
from mtkit.models.ensemble import Ensemble
from mtkit.models.transformer import Transformer

X, Y = 4, 5  # the two content tokens of the stub's vocabulary (ids 0..5)
VOCAB_SIZE = 6

# The first source token picks a table: generated prefix (without BOS) -> next-token probabilities.
# Tokens missing from a distribution have probability 0; prefixes missing from a table end the sentence.
KEY_BEAM, KEY_LENGTH, KEY_LIMIT, KEY_LONG = 10, 11, 12, 13
TABLES: dict[int, dict[tuple[int, ...], dict[int, float]]] = {
    # Greedy takes X (0.6) then X; beam 2 finds [Y] (0.4 * 0.9 = 0.36 > 0.6 * 0.45 = 0.27).
    KEY_BEAM: {
        (): {X: 0.6, Y: 0.4},
        (X,): {X: 0.45, Y: 0.25, EOS_ID: 0.3},
        (Y,): {EOS_ID: 0.9, X: 0.1},
    },
    # [] (0.55) wins on total log-probability, [X, X] (0.405 over 3 tokens) on the average.
    KEY_LENGTH: {
        (): {EOS_ID: 0.55, X: 0.45},
        (X,): {X: 1.0},
        (X, X): {EOS_ID: 0.9, Y: 0.1},
    },
}


def distribution(key: int, prefix: tuple[int, ...]) -> dict[int, float]:
    if key == KEY_LIMIT:  # the same distribution after every prefix
        return {X: 0.7, Y: 0.2, EOS_ID: 0.1}
    if key == KEY_LONG:  # EOS is never among the best two candidates, so only max_len stops it
        step = len(prefix)
        return {X: 0.5 + 0.04 * step, Y: 0.45 - 0.04 * step, EOS_ID: 0.05}
    return TABLES[key].get(prefix, {EOS_ID: 1.0})


class HandModel(EncoderDecoder):
    """Next-token probabilities looked up by (first source token, generated prefix).

    The state keeps the prefix as a tensor, so the default `reorder_state` keeps it in step with the
    beams; `batch_sizes` records the rows of every decode call.
    """

    def __init__(self) -> None:
        super().__init__()
        self.batch_sizes: list[int] = []

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return src.float().unsqueeze(-1)  # (B, S, 1): memory[:, 0, 0] is the table key

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, state: DecoderState | None = None
    ) -> tuple[Tensor, DecoderState | None]:
        assert state is not None and tgt.size(1) == 1, "search must decode one token at a time"
        self.batch_sizes.append(tgt.size(0))
        prefix = torch.cat([state.get("prefix", tgt.new_empty(tgt.size(0), 0)), tgt], dim=1)  # (B, t)
        assert prefix[:, 0].eq(BOS_ID).all()
        probabilities = torch.zeros(tgt.size(0), VOCAB_SIZE)
        for row, (key, tokens) in enumerate(zip(memory[:, 0, 0].long().tolist(), prefix.tolist(), strict=True)):
            for token, probability in distribution(key, tuple(tokens[1:])).items():
                probabilities[row, token] = probability
        return probabilities.log().unsqueeze(1), {"prefix": prefix}  # (B, 1, V)


def sources(*rows: list[int]) -> tuple[Tensor, Tensor]:
    """Right-padded src (B, S) and src_mask (B, S) from rows of ids."""
    width = max(len(row) for row in rows)
    src = torch.tensor([row + [PAD_ID] * (width - len(row)) for row in rows])
    return src, src.ne(PAD_ID)


def run_greedy(model: EncoderDecoder, src: Tensor, src_mask: Tensor, max_len: list[int], alpha: float = 0.0):
    return greedy_search(
        model, src, src_mask=src_mask, max_len=torch.tensor(max_len), options=SearchOptions(length_penalty=alpha)
    )


def run_beam(model, src, src_mask, max_len: list[int], beam_size: int, alpha: float = 0.0, nbest: int = 1):
    options = SearchOptions(beam=beam_size, length_penalty=alpha, nbest=nbest)
    return beam_search(model, src, src_mask=src_mask, max_len=torch.tensor(max_len), options=options)


def assert_hypothesis(hypothesis: Hypothesis, tokens: list[int], log_prob: float, alpha: float = 0.0) -> None:
    assert hypothesis.tokens == tokens
    assert hypothesis.log_prob == pytest.approx(log_prob, rel=1e-6)
    assert hypothesis.score == pytest.approx(log_prob / (len(tokens) + 1) ** alpha, rel=1e-6)


def test_length_penalty_counts_nothing_at_alpha_zero_and_works_on_tensors():
    assert length_penalty(4, 0.5) == pytest.approx(2.0)
    assert length_penalty(7, 0.0) == 1.0
    assert torch.allclose(length_penalty(torch.tensor([1, 4, 9]), 0.5), torch.tensor([1.0, 2.0, 3.0]))


def test_beam_step_takes_the_best_2k_candidates_over_beam_and_vocabulary():
    log_probs = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]]).log()  # (N=1, K=2, V=3)
    running = torch.tensor([[0.5, 0.4]]).log()  # (1, 2)
    before = (log_probs.clone(), running.clone())
    scores, beam_index, token = beam_step(log_probs, running)
    # candidates: beam 0 -> 0.25, 0.15, 0.10; beam 1 -> 0.04, 0.04, 0.32
    assert beam_index.tolist() == [[1, 0, 0, 0]]
    assert token.tolist() == [[2, 0, 1, 2]]
    assert torch.allclose(scores.exp(), torch.tensor([[0.32, 0.25, 0.15, 0.10]]))
    assert torch.equal(log_probs, before[0]) and torch.equal(running, before[1])  # pure


def test_greedy_takes_the_locally_best_token():
    [hypothesis] = run_greedy(HandModel(), *sources([KEY_BEAM]), max_len=[10])
    assert_hypothesis(hypothesis, [X, X], math.log(0.6) + math.log(0.45) + math.log(1.0))


def test_beam_two_finds_the_globally_better_sequence_and_orders_the_nbest():
    [hypotheses] = run_beam(HandModel(), *sources([KEY_BEAM]), max_len=[10], beam_size=2, nbest=2)
    assert len(hypotheses) == 2
    assert_hypothesis(hypotheses[0], [Y], math.log(0.4) + math.log(0.9))
    assert_hypothesis(hypotheses[1], [X, X], math.log(0.6) + math.log(0.45))
    [[best]] = run_beam(HandModel(), *sources([KEY_BEAM]), max_len=[10], beam_size=2, nbest=1)
    assert best.tokens == [Y]


@pytest.mark.parametrize(("alpha", "winner"), [(0.0, []), (1.0, [X, X])])
def test_length_penalty_changes_the_winner(alpha: float, winner: list[int]):
    [hypotheses] = run_beam(HandModel(), *sources([KEY_LENGTH]), max_len=[10], beam_size=2, alpha=alpha, nbest=2)
    log_probs = {(): math.log(0.55), (X, X): math.log(0.45 * 1.0 * 0.9)}
    assert hypotheses[0].tokens == winner
    assert [tuple(h.tokens) for h in hypotheses] == sorted(log_probs, key=lambda t: -log_probs[t] / (len(t) + 1) ** alpha)
    for hypothesis in hypotheses:
        assert_hypothesis(hypothesis, hypothesis.tokens, log_probs[tuple(hypothesis.tokens)], alpha)


@pytest.mark.parametrize("max_len", [0, 1, 3])
def test_greedy_forces_eos_at_max_len_and_adds_its_log_prob(max_len: int):
    [hypothesis] = run_greedy(HandModel(), *sources([KEY_LIMIT]), max_len=[max_len])
    assert_hypothesis(hypothesis, [X] * max_len, max_len * math.log(0.7) + math.log(0.1))


def test_beam_forces_eos_at_max_len_and_adds_its_log_prob():
    [hypotheses] = run_beam(HandModel(), *sources([KEY_LIMIT]), max_len=[1], beam_size=2, nbest=2)
    assert_hypothesis(hypotheses[0], [X], math.log(0.7) + math.log(0.1))
    assert_hypothesis(hypotheses[1], [Y], math.log(0.2) + math.log(0.1))


def test_nbest_larger_than_beam_is_refused():
    with pytest.raises(MtkitError, match="nbest"):
        run_beam(HandModel(), *sources([KEY_BEAM]), max_len=[5], beam_size=2, nbest=3)


BATCH_ROWS = [[KEY_BEAM, 7, 7], [KEY_LENGTH], [KEY_LIMIT, 8], [KEY_LONG, 9, 9, 9]]
BATCH_MAX_LEN = [10, 10, 1, 6]


def test_greedy_batch_equals_one_sentence_at_a_time_and_shrinks():
    model = HandModel()
    batch = run_greedy(model, *sources(*BATCH_ROWS), max_len=BATCH_MAX_LEN, alpha=0.5)
    # KEY_LENGTH ends at step 0, KEY_LIMIT at 1, KEY_BEAM at 2, KEY_LONG at its max_len 6.
    assert model.batch_sizes == [4, 3, 2, 1, 1, 1, 1]
    alone = [
        run_greedy(model, *sources(row), max_len=[limit], alpha=0.5)[0]
        for row, limit in zip(BATCH_ROWS, BATCH_MAX_LEN, strict=True)
    ]
    assert batch == alone
    assert [len(h.tokens) for h in batch] == [2, 0, 1, 6]


def test_beam_batch_equals_one_sentence_at_a_time_and_shrinks():
    model = HandModel()
    batch = run_beam(model, *sources(*BATCH_ROWS), max_len=BATCH_MAX_LEN, beam_size=2, alpha=0.5, nbest=2)
    # Rows are sentences x 2 beams (one a sentence at step 0, where only beam 0 is alive): KEY_LIMIT leaves after
    # step 1, KEY_BEAM and KEY_LENGTH after step 2.
    assert model.batch_sizes == [4, 8, 6, 2, 2, 2, 2]
    alone = [
        run_beam(model, *sources(row), max_len=[limit], beam_size=2, alpha=0.5, nbest=2)[0]
        for row, limit in zip(BATCH_ROWS, BATCH_MAX_LEN, strict=True)
    ]
    assert batch == alone
    assert [[h.tokens for h in hypotheses] for hypotheses in batch[:3]] == [[[Y], [X, X]], [[X, X], []], [[X], [Y]]]
    assert all(len(h.tokens) == 6 for h in batch[3])


@pytest.mark.parametrize("key", [KEY_BEAM, KEY_LENGTH, KEY_LIMIT, KEY_LONG])
def test_beam_one_equals_greedy_on_the_stub(key: int):
    src, src_mask = sources([key, 7])
    [[beam]] = run_beam(HandModel(), src, src_mask, max_len=[4], beam_size=1, alpha=1.0)
    [greedy] = run_greedy(HandModel(), src, src_mask, max_len=[4], alpha=1.0)
    assert beam == greedy


class TinyRandomModel(EncoderDecoder):
    """A randomly initialised model: the next token depends on the whole prefix and the source."""

    def __init__(self, vocab_size: int = 12, dim: int = 16, max_positions: int = 32) -> None:
        super().__init__()
        self.src_embedding = nn.Embedding(vocab_size, dim)
        self.tgt_embedding = nn.Embedding(vocab_size, dim)
        self.position = nn.Embedding(max_positions, dim)
        self.output = nn.Linear(dim, vocab_size)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return self.src_embedding(src) * src_mask.unsqueeze(-1)  # (B, S, D)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, state: DecoderState | None = None
    ) -> tuple[Tensor, DecoderState | None]:
        prefix = tgt if state is None else torch.cat([state.get("prefix", tgt[:, :0]), tgt], dim=1)  # (B, t)
        context = memory.sum(1) / src_mask.sum(1, keepdim=True)  # (B, D)
        positions = self.position.weight[: prefix.size(1)]  # (t, D)
        hidden = torch.tanh(self.tgt_embedding(prefix).cumsum(1) + positions + context.unsqueeze(1))  # (B, t, D)
        logits = 3.0 * self.output(hidden)  # (B, t, V)
        if state is None:
            return logits, None
        return logits[:, -tgt.size(1) :], {"prefix": prefix}


def random_batch(seed: int = 0) -> tuple[TinyRandomModel, Tensor, Tensor, Tensor]:
    torch.manual_seed(seed)
    model = TinyRandomModel().eval()
    rows = [torch.randint(4, 12, (length,)).tolist() for length in [5, 2, 7, 3, 4, 6, 1, 5]]
    src, src_mask = sources(*rows)
    max_len = src_mask.sum(1) + 3  # (B,)
    return model, src, src_mask, max_len


def test_beam_one_equals_greedy_on_a_random_model():
    model, src, src_mask, max_len = random_batch()
    greedy = greedy_search(model, src, src_mask=src_mask, max_len=max_len, options=SearchOptions(length_penalty=0.6))
    beam = beam_search(model, src, src_mask=src_mask, max_len=max_len, options=SearchOptions(beam=1, length_penalty=0.6))
    assert [hypotheses[0] for hypotheses in beam] == greedy
    # Sentences finish at different steps, some on EOS and some at max_len.
    lengths = [len(h.tokens) for h in greedy]
    assert len(set(lengths)) > 1
    assert any(length == limit for length, limit in zip(lengths, max_len.tolist(), strict=True))
    assert any(length < limit for length, limit in zip(lengths, max_len.tolist(), strict=True))


def test_beam_hypotheses_score_what_teacher_forcing_scores():
    """Each hypothesis's log_prob is the model's own probability of it: beams were reordered right."""
    model, src, src_mask, max_len = random_batch(seed=1)
    alpha = 1.0
    results = beam_search(
        model, src, src_mask=src_mask, max_len=max_len, options=SearchOptions(beam=4, length_penalty=alpha, nbest=3)
    )
    for sentence, hypotheses in enumerate(results):
        assert len(hypotheses) == 3
        assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
        for hypothesis in hypotheses:
            assert EOS_ID not in hypothesis.tokens and len(hypothesis.tokens) <= max_len[sentence]
            tgt = torch.tensor([[BOS_ID, *hypothesis.tokens, EOS_ID]])
            with torch.no_grad():
                logits = model(src[sentence : sentence + 1], src_mask[sentence : sentence + 1], tgt[:, :-1])
            log_prob = logits.log_softmax(-1).gather(2, tgt[:, 1:].unsqueeze(2)).sum().item()
            assert hypothesis.log_prob == pytest.approx(log_prob, abs=1e-4)
            assert hypothesis.score == pytest.approx(log_prob / (len(hypothesis.tokens) + 1) ** alpha, abs=1e-4)


def test_impossible_candidates_are_never_finalised():
    """With more beams than possible sequences, the -inf beams must neither finish nor stop the search."""
    model = HandModel()
    [hypotheses] = run_beam(model, *sources([KEY_LENGTH]), max_len=[10], beam_size=4, alpha=1.0, nbest=4)
    assert [h.tokens for h in hypotheses] == [[X, X], [], [X, X, Y]]
    assert len(model.batch_sizes) == 4  # stops once every beam left is impossible, long before max_len
    assert_hypothesis(hypotheses[2], [X, X, Y], math.log(0.45 * 0.1), alpha=1.0)


def test_a_wide_beam_finds_every_possible_sequence_and_nothing_impossible():
    [hypotheses] = run_beam(HandModel(), *sources([KEY_BEAM]), max_len=[10], beam_size=6, nbest=6)
    expected = {(Y,): 0.4 * 0.9, (X, X): 0.6 * 0.45, (X,): 0.6 * 0.3, (X, Y): 0.6 * 0.25, (Y, X): 0.4 * 0.1}
    assert [tuple(h.tokens) for h in hypotheses] == sorted(expected, key=expected.get, reverse=True)
    for hypothesis in hypotheses:
        assert_hypothesis(hypothesis, hypothesis.tokens, math.log(expected[tuple(hypothesis.tokens)]))


class StopAfter:
    """A `stop` that says True from its `calls`-th question on, counting the questions."""

    def __init__(self, calls: int) -> None:
        self.calls, self.asked = calls, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.asked >= self.calls


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_stop_ends_the_search_before_the_next_step(beam_size: int):
    model, src, src_mask, max_len = random_batch()
    beam = SearchOptions(beam=beam_size, length_penalty=0.6)
    unstopped = beam_search(model, src, src_mask=src_mask, max_len=max_len, options=beam)
    steps, decode = [], model.decode
    model.decode = lambda *arguments, **options: (steps.append(1), decode(*arguments, **options))[1]
    never = StopAfter(10**9)
    assert beam_search(model, src, src_mask=src_mask, max_len=max_len, options=replace(beam, stop=never)) == unstopped
    assert never.asked == len(steps)  # asked before every step
    for search in (
        lambda stop: greedy_search(model, src, src_mask=src_mask, max_len=max_len, options=SearchOptions(stop=stop)),
        lambda stop: beam_search(model, src, src_mask=src_mask, max_len=max_len, options=replace(beam, stop=stop)),
    ):
        stop = StopAfter(3)
        with pytest.raises(SearchStopped):
            search(stop)
        assert stop.asked == 3  # two steps were taken, the third never began


class FullPrefix(EncoderDecoder):
    """The straightforward reference of incremental decoding: `model` decoding the whole prefix teacher-forced at
    every step, with no cache (its state holds only the prefix, reordered like any cached tensor)."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return self.model.encode(src, src_mask)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, state: DecoderState | None = None
    ) -> tuple[Tensor, DecoderState | None]:
        assert state is not None
        prefix = torch.cat([state["prefix"], tgt], dim=1) if "prefix" in state else tgt  # (B, t)
        logits, _ = self.model.decode(prefix, memory, src_mask=src_mask, state=None)  # (B, t, V)
        return logits[:, -tgt.size(1) :], {"prefix": prefix}

    def reorder_state(self, state: DecoderState, order: Tensor, *, keep_memory: bool = False) -> DecoderState:
        return {"prefix": state["prefix"][order]}  # its own, so that the reference never shares the model's


def random_transformers(count: int) -> list[Transformer]:
    """Small random Transformers in float64, so that incremental and full-prefix decoding agree far below any gap
    between two candidates' scores."""
    torch.manual_seed(5)
    shape = dict(layers=2, d_model=32, heads=4, ffn_dim=48, dropout=0.0)
    return [Transformer(24, 24, **shape).double().eval() for _ in range(count)]


@pytest.mark.parametrize("members", [1, 2])
@pytest.mark.parametrize("options", [SearchOptions(length_penalty=0.6), SearchOptions(beam=4, nbest=4, length_penalty=1.0)])
def test_cached_decoding_finds_what_decoding_the_whole_prefix_finds(members: int, options: SearchOptions):
    """The decoder's cache (self-attention keys and values, the source's, their reordering as beams move and
    sentences finish) changes no hypothesis: the same tokens and scores as recomputing every prefix."""
    models = random_transformers(members)
    model = models[0] if members == 1 else Ensemble(models)
    torch.manual_seed(6)
    src, src_mask = sources(*(torch.randint(4, 24, (length,)).tolist() for length in [6, 2, 9, 4, 1, 7]))
    max_len = torch.tensor([3, 8, 12, 1, 6, 9])
    search = greedy_search if options.beam == 1 else beam_search
    found = search(model, src, src_mask=src_mask, max_len=max_len, options=options)
    reference = search(FullPrefix(model), src, src_mask=src_mask, max_len=max_len, options=options)
    hypotheses = [[h] if isinstance(h, Hypothesis) else h for h in found]
    expected = [[h] if isinstance(h, Hypothesis) else h for h in reference]
    assert [[h.tokens for h in row] for row in hypotheses] == [[h.tokens for h in row] for row in expected]
    assert [h.log_prob for row in hypotheses for h in row] == pytest.approx([h.log_prob for row in expected for h in row])
    assert len({len(h.tokens) for row in hypotheses for h in row}) > 2  # sentences end at different steps


class SearchOps(TorchDispatchMode):
    """Counts the aten ops a search dispatches outside the model's `encode` and `decode` (its bookkeeping), and
    the steps (calls of `decode`)."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.ops, self.steps, self.in_model = 0, 0, False
        self.encode, self.decode = model.encode, model.decode
        model.encode, model.decode = self.counted(self.encode), self.counted(self.decode, step=True)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's signature
        self.ops += not self.in_model
        return func(*args, **(kwargs or {}))

    def counted(self, method: Callable, *, step: bool = False) -> Callable:
        def call(*arguments, **options):  # noqa: ANN002, ANN003, ANN202 - the model's own signature
            self.steps, self.in_model = self.steps + step, True
            try:
                return method(*arguments, **options)
            finally:
                self.in_model = False

        return call


@pytest.mark.parametrize(("beam", "most_per_step"), [(1, 36), (4, 90)])  # each was 44 and 146 before
def test_the_search_bookkeeping_takes_a_bounded_number_of_ops_per_step(beam: int, most_per_step: int):
    """The search's own work per step is a few dozen small ops whatever the batch: no op per hypothesis or
    sentence, nothing reselected while every sentence stays (on a small model each op costs about as much as one
    of its kernels). The bounds leave room for another torch's ops, not for a loop."""
    [model] = random_transformers(1)
    torch.manual_seed(6)
    src, src_mask = sources(*(torch.randint(4, 24, (length,)).tolist() for length in [6, 2, 9, 4, 1, 7] * 4))
    max_len = torch.tensor([3, 8, 12, 1, 6, 9] * 4)
    counter = SearchOps(model)
    search = greedy_search if beam == 1 else beam_search
    with counter:
        search(model, src, src_mask=src_mask, max_len=max_len, options=SearchOptions(beam=beam, nbest=beam))
    assert counter.ops / counter.steps <= most_per_step
