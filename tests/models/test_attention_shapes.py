"""Attention by the batch's shape: the source padding bias is built once per batch, an unpadded
batch (`src_padded=False`) attends with no mask, and neither changes what the model computes."""

from __future__ import annotations

import pytest
import torch
from helpers import random_batch, small_transformer

from mtkit.decoding.search import SearchOptions, beam_search, greedy_search
from mtkit.models.base import padding_mask
from mtkit.models.layers import key_padding_bias
from mtkit.training.batches import collate

FP32_ROUNDING = 1e-6


def padded_batch():
    """Three sources of 7, 4 and 2 real tokens (padded with 0), their mask and targets."""
    src, _, tgt = random_batch()
    src[1, 4:], src[2, 2:] = 0, 0
    return src, padding_mask(src, 0), tgt


def per_layer_bool_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """The masked path as it was: every layer given the bool mask (B, 1, 1, S) and converting it itself."""
    bool_mask = lambda src_mask, src_padded, like: src_mask[:, None, None, :]  # noqa: E731
    monkeypatch.setattr("mtkit.models.transformer.key_padding_bias", bool_mask)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_once_built_bias_equals_the_per_layer_bool_mask(monkeypatch, norm):
    model = small_transformer(norm=norm)
    src, src_mask, tgt = padded_batch()
    logits = model(src, src_mask, tgt, src_padded=True)
    weights = model.cross_attention(tgt, model.encode(src, src_mask), src_mask=src_mask)
    per_layer_bool_mask(monkeypatch)
    assert (model(src, src_mask, tgt) - logits).abs().max() <= FP32_ROUNDING
    assert (model.cross_attention(tgt, model.encode(src, src_mask), src_mask=src_mask) - weights).abs().max() <= FP32_ROUNDING


def test_unpadded_batch_takes_the_unmasked_path_with_the_same_logits():
    model = small_transformer()
    src, src_mask, tgt = random_batch()
    assert key_padding_bias(src_mask, src_padded=False, like=src.float()) is None
    unmasked = model(src, src_mask, tgt, src_padded=False)
    for known in (None, True):
        assert (model(src, src_mask, tgt, src_padded=known) - unmasked).abs().max() <= FP32_ROUNDING
    memory = model.encode(src, src_mask, src_padded=False)
    states = model.final_states(tgt, memory, src_mask=src_mask, src_padded=False)
    assert (model.output(states) - unmasked).abs().max() <= FP32_ROUNDING


def test_padding_does_not_change_the_other_positions():
    model = small_transformer()
    src, src_mask, tgt = padded_batch()
    batched = model(src, src_mask, tgt, src_padded=True)
    for row, length in ((1, 4), (2, 2)):
        alone = model(src[row : row + 1, :length], src_mask[row : row + 1, :length], tgt[row : row + 1], src_padded=False)
        torch.testing.assert_close(batched[row : row + 1], alone, atol=1e-5, rtol=1e-5)
    changed = src.clone()
    changed[1, 4:] = 9  # other ids under the padding mask
    torch.testing.assert_close(model(changed, src_mask, tgt, src_padded=True)[1], batched[1], atol=1e-6, rtol=0)


def test_bias_takes_the_autocast_dtype_and_drops_padding():
    src, src_mask, _ = padded_batch()
    bias = key_padding_bias(src_mask, src_padded=None, like=torch.zeros(1))
    assert bias is not None and bias.shape == (3, 1, 1, 7) and bias.dtype == torch.float32
    assert torch.equal(bias[:, 0, 0].isneginf(), ~src_mask) and bias[src_mask[:, None, None, :]].eq(0).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert key_padding_bias(src_mask, src_padded=True, like=torch.zeros(1)).dtype == torch.bfloat16


def test_incremental_decoding_keeps_the_bias_once_and_matches_teacher_forcing():
    model = small_transformer()
    src, src_mask, tgt = padded_batch()
    memory = model.encode(src, src_mask, src_padded=True)
    full, _ = model.decode(tgt, memory, src_mask=src_mask, state=None, src_padded=True)
    state: dict = {}
    steps = []
    for position in range(tgt.size(1)):
        logits, state = model.decode(tgt[:, position : position + 1], memory, src_mask=src_mask, state=state, src_padded=True)
        steps.append(logits)
    assert state["cross_bias"].shape == (3, 1, 1, 7)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [True, False])
def test_search_gives_the_same_hypotheses_with_the_hint(padded):
    model = small_transformer()
    src, src_mask, _ = padded_batch() if padded else random_batch()
    caps = torch.full((3,), 6)
    options = SearchOptions(beam=3, nbest=2)
    hinted = beam_search(model, src, src_mask=src_mask, max_len=caps, options=options, src_padded=padded)
    plain = beam_search(model, src, src_mask=src_mask, max_len=caps, options=options)
    assert [[h.tokens for h in found] for found in hinted] == [[h.tokens for h in found] for found in plain]
    for mine, theirs in zip(hinted, plain, strict=True):
        assert [h.score for h in mine] == pytest.approx([h.score for h in theirs], abs=1e-5)
    greedy = greedy_search(model, src, src_mask=src_mask, max_len=caps, src_padded=padded)
    assert [h.tokens for h in greedy] == [h.tokens for h in greedy_search(model, src, src_mask=src_mask, max_len=caps)]


@pytest.mark.parametrize(
    ("sources", "length_multiple", "padded"),
    [([[5, 6], [7, 8]], 1, False), ([[5, 6], [7]], 1, True), ([[5, 6], [7, 8]], 4, True), ([[5, 6, 7], [8, 9, 4]], 4, False)],
)
def test_collate_tells_from_the_lengths_whether_the_source_is_padded(sources, length_multiple, padded):
    batch = collate(sources, [[5]] * len(sources), length_multiple=length_multiple)
    assert batch.src_padded is padded
    assert bool((~batch.src_mask).any()) is padded
    assert batch.to(torch.device("meta")).src_padded is padded
