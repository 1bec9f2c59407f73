"""The RNN encoder-decoders honour the model contract: shapes, attention masking, padding,
incremental decoding and tied embeddings (learning and the pipeline: tests/integration/models/test_rnn.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from mtkit.config import ModelConfig
from mtkit.errors import MtkitError
from mtkit.models import build_model
from mtkit.models.base import padding_mask
from mtkit.models.rnn import RNNSeq2Seq

VOCAB, BOS, EOS = 20, 2, 3
ATTENTION = ["none", "bahdanau", "luong_dot", "luong_general"]
COMBINATIONS = [
    {"cell": cell, "attention": attention, "input_feed": feed}
    for cell, attention, feed in itertools.product(["lstm", "gru"], ATTENTION, [False, True])
    if not feed or attention.startswith("luong")
]


def small_rnn(**overrides) -> RNNSeq2Seq:
    torch.manual_seed(0)
    arguments = dict(layers=2, hidden_size=16, embed_dim=8, dropout=0.0)
    arguments.update(overrides)
    return RNNSeq2Seq(VOCAB, VOCAB, **arguments).eval()


def padded_batch():
    """Three sources of lengths 7, 5 and 3 (padding 0) and three 6-token targets."""
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 7), generator=generator)
    src[1, 5:] = 0
    src[2, 3:] = 0
    tgt = torch.randint(4, VOCAB, (3, 6), generator=generator)
    return src, padding_mask(src, 0), tgt


def _name(combination: dict) -> str:
    return "-".join(str(v) for v in combination.values())


@pytest.mark.parametrize("combination", COMBINATIONS, ids=_name)
def test_shapes(combination):
    model = small_rnn(**combination)
    src, src_mask, tgt = padded_batch()
    memory = model.encode(src, src_mask)
    logits, state = model.decode(tgt, memory, src_mask=src_mask, state=None)
    assert memory.shape == (3, 7, 16)
    assert logits.shape == (3, 6, VOCAB)
    assert state is None
    _, state = model.decode(tgt[:, :1], memory, src_mask=src_mask, state={})
    assert state["hidden"].shape == (3, 2, 16)
    assert ("cell" in state) == (combination["cell"] == "lstm")
    assert ("feed" in state) == combination["input_feed"]
    assert ("cross_keys" in state) == (combination["attention"] != "none")


@pytest.mark.parametrize("combination", [c for c in COMBINATIONS if c["attention"] != "none"], ids=_name)
def test_attention_is_zero_on_source_padding_and_each_row_sums_to_one(combination):
    model = small_rnn(**combination)
    src, src_mask, tgt = padded_batch()
    weights = model.cross_attention(tgt, model.encode(src, src_mask), src_mask=src_mask)  # (B, 1, T, S)
    assert weights.shape == (3, 1, 6, 7)
    assert torch.all(weights[1, :, :, 5:] == 0) and torch.all(weights[2, :, :, 3:] == 0)
    assert torch.all(weights[:, :, :, :3] > 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 1, 6))


def test_a_model_without_attention_has_no_heatmap():
    model = small_rnn(attention="none")
    src, src_mask, tgt = padded_batch()
    with pytest.raises(MtkitError, match="no attention"):
        model.cross_attention(tgt, model.encode(src, src_mask), src_mask=src_mask)


@pytest.mark.parametrize("combination", COMBINATIONS, ids=_name)
def test_source_padding_does_not_change_outputs(combination):
    model = small_rnn(**combination)
    src, src_mask, tgt = padded_batch()
    plain = model(src[1:2, :5], src_mask[1:2, :5], tgt[1:2])
    padded = model(src[1:2], src_mask[1:2], tgt[1:2])  # the same sentence with two pads
    in_batch = model(src, src_mask, tgt)[1:2]
    torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(in_batch, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combination", COMBINATIONS, ids=_name)
def test_incremental_decoding_equals_teacher_forcing(combination):
    model = small_rnn(**combination)
    src, src_mask, tgt = padded_batch()
    memory = model.encode(src, src_mask)
    full, _ = model.decode(tgt, memory, src_mask=src_mask, state=None)
    state: dict = {}
    steps = []
    for position in range(tgt.size(1)):
        logits, state = model.decode(tgt[:, position : position + 1], memory, src_mask=src_mask, state=state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-6)
    # Reordering the state reorders the next step's output.
    order = torch.tensor([2, 0, 1])
    reordered = model.reorder_state(dict(state), order)
    after, _ = model.decode(tgt[order, -1:], memory[order], src_mask=src_mask[order], state=reordered)
    expected, _ = model.decode(tgt[:, -1:], memory, src_mask=src_mask, state=state)
    torch.testing.assert_close(after, expected[order])


def test_tied_embeddings_share_one_matrix_and_settings_are_checked():
    model = small_rnn(tie_embeddings=True)
    assert model.output.weight is model.decoder.embed.weight is model.encoder.embed.weight
    untied = small_rnn(tie_embeddings=False)
    assert untied.output.weight is not untied.decoder.embed.weight
    with pytest.raises(MtkitError, match="input_feed"):
        small_rnn(attention="bahdanau", input_feed=True)
    with pytest.raises(MtkitError, match="even"):
        small_rnn(hidden_size=15, bidirectional=True)
    config = ModelConfig(arch="rnn", cell="gru", layers=1, hidden_size=16, embed_dim=8, attention="luong_general")
    built = build_model(config, VOCAB, tgt_vocab_size=VOCAB, share_vocab=True)
    assert isinstance(built, RNNSeq2Seq) and isinstance(built.decoder.rnn, torch.nn.GRU)
