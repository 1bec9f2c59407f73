"""Beam search leaves the Transformer's self-attention cache where it was written and reorders an ancestry instead,
and reads a sentence's cached memory keys once for all its beams: the same hypotheses and scores as copying every
cached row at every step, with no copy of the cache in the usual step."""

from __future__ import annotations

import pytest
import torch
from helpers import SMALL_VOCAB, small_transformer
from torch import Tensor

from mtkit.decoding.search import SearchOptions, beam_search
from mtkit.models.ancestry import ANCESTRY, materialized
from mtkit.models.base import DecoderState, EncoderDecoder
from mtkit.models.transformer import Transformer

BEAMS = 3


class CopyingTransformer(Transformer):
    """The same model reordering by copies, its memory entries one row a beam: the contract's plain reading."""

    memory_per_sentence = False

    def reorder_state(self, state: DecoderState, order: Tensor, *, keep_memory: bool = False) -> DecoderState:
        return EncoderDecoder.reorder_state(self, state, order, keep_memory=keep_memory)


def twin_models(seed: int) -> tuple[Transformer, Transformer]:
    model = small_transformer(layers=2).double()
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    copying = CopyingTransformer(SMALL_VOCAB, SMALL_VOCAB, layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0).double()
    copying.load_state_dict(model.state_dict())
    return model, copying.eval()


def sources(seed: int) -> tuple[Tensor, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, SMALL_VOCAB, (5, 8), generator=generator)
    src[1, 5:] = 0
    src[3, 3:] = 0
    return src, src != 0, torch.tensor([2, 9, 14, 5, 20])  # outputs capped at different steps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_over_the_ancestry_equals_copying_every_row(seed):
    model, copying = twin_models(seed)
    src, src_mask, max_len = sources(seed)
    options = SearchOptions(beam=BEAMS, length_penalty=0.6, nbest=BEAMS)
    with torch.inference_mode():
        found = beam_search(model, src, src_mask=src_mask, max_len=max_len, options=options)
        expected = beam_search(copying, src, src_mask=src_mask, max_len=max_len, options=options)
    assert [[h.tokens for h in nbest] for nbest in found] == [[h.tokens for h in nbest] for nbest in expected]
    assert len({len(nbest[0].tokens) for nbest in found}) > 2  # sentences left the batch at several steps
    for nbest, others in zip(found, expected, strict=True):
        assert [h.log_prob for h in nbest] == pytest.approx([h.log_prob for h in others], abs=1e-6)


def steps_of_a_beam(model: Transformer, reorders: list[Tensor]) -> tuple[DecoderState, list[Tensor]]:
    """Two sentences of BEAMS beams decoded step by step, their beams reordered by `reorders` in turn."""
    src, src_mask, _ = sources(0)
    src, src_mask = src[:2], src_mask[:2]
    memory = model.encode(src, src_mask)
    first = torch.tensor([[1], [1]])
    logits, state = model.decode(first, memory, src_mask=src_mask, state={})
    repeat = torch.arange(2).repeat_interleave(BEAMS)
    state = model.reorder_state(state, repeat, keep_memory=True)
    memory, src_mask = memory[repeat], src_mask[repeat]
    found = [logits[repeat]]
    for step, order in enumerate(reorders):
        tokens = torch.arange(2 * BEAMS).unsqueeze(1) + 4 + step
        logits, state = model.decode(tokens, memory, src_mask=src_mask, state=state)
        found.append(logits)
        state = model.reorder_state(state, order, keep_memory=True)
    return state, found


def test_the_cache_stays_in_place_and_gathers_back_to_what_copies_give():
    model, copying = twin_models(0)
    generator = torch.Generator().manual_seed(3)
    firsts = torch.tensor([[0], [BEAMS]])  # each sentence's first row: beams move among their sentence's rows
    reorders = [(torch.randint(0, BEAMS, (2, BEAMS), generator=generator) + firsts).flatten() for _ in range(5)]
    with torch.inference_mode():
        state, logits = steps_of_a_beam(model, reorders)
        expected_state, expected = steps_of_a_beam(copying, reorders)
    for found, wanted in zip(logits, expected, strict=True):
        torch.testing.assert_close(found, wanted, rtol=0, atol=1e-10)
    assert ANCESTRY in state and ANCESTRY not in expected_state
    assert state["0.cross_k"].size(0) == 2 and expected_state["0.cross_k"].size(0) == 2 * BEAMS  # a row a sentence
    plain = materialized(state)
    for key in ("0.self_k", "1.self_v"):
        torch.testing.assert_close(plain[key], expected_state[key], rtol=0, atol=1e-12)


def test_the_usual_step_copies_no_cached_row():
    model, _ = twin_models(0)
    order = torch.tensor([0, 0, 1, 5, 3, 3])
    with torch.inference_mode():
        state, _ = steps_of_a_beam(model, [order])
        buffers = {key: value.data_ptr() for key, value in state.items() if key != ANCESTRY}
        again = model.reorder_state(state, torch.tensor([2, 1, 1, 4, 4, 3]), keep_memory=True)
    assert {key: value.data_ptr() for key, value in again.items() if key != ANCESTRY} == buffers


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_sentences_beams_read_its_one_row_of_memory_keys_as_the_repeated_keys_give(need_weights):
    model = small_transformer().double()
    attention = model.decoder_layers[0].cross_attention
    generator = torch.Generator().manual_seed(4)
    x, memory = torch.randn(2 * BEAMS, 1, 32, generator=generator).double(), torch.randn(2, 5, 32, generator=generator).double()
    bias = torch.zeros(2, 1, 1, 5, dtype=torch.float64)
    bias[1, ..., 3:] = float("-inf")  # the second sentence's source is padded
    cache: DecoderState = {}
    attention(x[::BEAMS], memory, bias, cache)  # keys and values cached for one row a sentence
    found, weights = attention(x, memory, bias, cache, need_weights=need_weights)
    repeat = torch.arange(2).repeat_interleave(BEAMS)
    expected, expected_weights = attention(x, memory[repeat], bias[repeat], None, need_weights=need_weights)
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-12)
    if need_weights:
        torch.testing.assert_close(weights, expected_weights, rtol=0, atol=1e-12)
        assert weights[BEAMS:, ..., 3:].eq(0).all()


@pytest.mark.parametrize("order", [[2, 4], [0, 1, 3, 4, 5], [4, 3, 5]])
def test_any_selection_of_rows_after_the_beams_reads_each_rows_own_source(order):
    """Rows chosen one by one (not whole sentences' beams) each keep their sentence's memory."""
    model, copying = twin_models(0)
    pick = torch.tensor(order)
    found = []
    for each in (model, copying):
        state, _ = steps_of_a_beam(each, [torch.tensor([0, 0, 1, 5, 3, 3])])
        src, src_mask, _ = sources(0)
        memory = each.encode(src[:2], src_mask[:2]).repeat_interleave(BEAMS, dim=0)[pick]
        state = each.reorder_state(state, pick)
        with torch.inference_mode():
            logits, _ = each.decode(
                torch.full((pick.numel(), 1), 7), memory, src_mask=src_mask[:2].repeat_interleave(BEAMS, 0)[pick], state=state
            )
        found.append(logits)
    torch.testing.assert_close(found[0], found[1], rtol=0, atol=1e-10)
