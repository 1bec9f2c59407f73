"""The Transformer honours the model contract: shapes, masking, causality, incremental decoding."""

from __future__ import annotations

import pytest
import torch

from mtkit.config import ModelConfig
from mtkit.errors import MtkitError
from mtkit.models import Transformer, build_model
from mtkit.models.base import causal_mask, padding_mask
from mtkit.models.layers import Dropout, LearnedPositions, SinusoidalPositions

VOCAB = 40


def small_transformer(**overrides) -> Transformer:
    torch.manual_seed(0)
    arguments = dict(layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0)
    arguments.update(overrides)
    return Transformer(VOCAB, VOCAB, **arguments).eval()


def random_batch(batch: int = 3, src_len: int = 7, tgt_len: int = 6):
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (batch, src_len), generator=generator)
    tgt = torch.randint(4, VOCAB, (batch, tgt_len), generator=generator)
    return src, torch.ones_like(src, dtype=torch.bool), tgt


VARIANTS = [
    {"norm": "pre", "positions": "sinusoidal"},
    {"norm": "post", "positions": "sinusoidal"},
    {"norm": "pre", "positions": "learned"},
    {"norm": "post", "positions": "learned", "tie_embeddings": False},
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_shapes(variant):
    model = small_transformer(**variant)
    src, src_mask, tgt = random_batch()
    memory = model.encode(src, src_mask)
    logits, state = model.decode(tgt, memory, src_mask, None)
    assert memory.shape == (3, 7, 32)
    assert logits.shape == (3, 6, VOCAB)
    assert state is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_source_padding_does_not_change_outputs(variant):
    model = small_transformer(**variant)
    src, src_mask, tgt = random_batch(batch=1)
    padded = torch.cat([src, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    padded_mask = padding_mask(padded, 0)
    plain = model(src, src_mask, tgt)
    with_padding = model(padded, padded_mask, tgt)
    torch.testing.assert_close(with_padding, plain, atol=1e-5, rtol=1e-5)
    memory = model.encode(padded, padded_mask)
    torch.testing.assert_close(memory[:, :7], model.encode(src, src_mask), atol=1e-5, rtol=1e-5)


def test_padding_in_one_sentence_does_not_change_another():
    model = small_transformer()
    src, src_mask, tgt = random_batch(batch=2)
    src[1, 4:] = 0
    src_mask = padding_mask(src, 0)
    alone = model(src[:1], src_mask[:1], tgt[:1])
    together = model(src, src_mask, tgt)
    torch.testing.assert_close(together[:1], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_future_target_token_does_not_change_earlier_logits(variant):
    model = small_transformer(**variant)
    src, src_mask, tgt = random_batch()
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 4) % (VOCAB - 4) + 4
    before = model(src, src_mask, tgt)
    after = model(src, src_mask, changed)
    torch.testing.assert_close(after[:, :4], before[:, :4], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(after[:, 4:], before[:, 4:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_incremental_decoding_equals_full_decoding(variant):
    model = small_transformer(**variant)
    src, src_mask, tgt = random_batch()
    src[0, 5:] = 0
    src_mask = padding_mask(src, 0)
    full = model(src, src_mask, tgt)
    memory = model.encode(src, src_mask)
    state: dict = {}
    steps = []
    for position in range(tgt.size(1)):
        logits, state = model.decode(tgt[:, position : position + 1], memory, src_mask, state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # Several new tokens at once on top of a cache (a prefix, then the rest) also agree.
    _, cached = model.decode(tgt[:, :2], memory, src_mask, {})
    rest, _ = model.decode(tgt[:, 2:], memory, src_mask, cached)
    torch.testing.assert_close(rest, full[:, 2:], atol=1e-5, rtol=1e-5)


def test_reorder_state_follows_the_batch_order():
    model = small_transformer()
    src, src_mask, tgt = random_batch()
    memory = model.encode(src, src_mask)
    _, state = model.decode(tgt[:, :3], memory, src_mask, {})
    order = torch.tensor([2, 0])
    reordered = model.reorder_state(state, order)
    next_logits, _ = model.decode(tgt[order, 3:4], memory[order], src_mask[order], reordered)
    full = model(src[order], src_mask[order], tgt[order, :4])
    torch.testing.assert_close(next_logits[:, 0], full[:, 3], atol=1e-5, rtol=1e-5)


def test_embeddings_are_scaled_and_tied():
    model = small_transformer()
    assert model.output.weight is model.tgt_embed.weight
    assert model.src_embed is model.tgt_embed
    tokens = torch.tensor([[5, 6]])
    expected = model.tgt_embed.weight[tokens] * 32**0.5
    torch.testing.assert_close(model.tgt_embed(tokens), expected)
    untied = small_transformer(tie_embeddings=False)
    assert untied.output.weight is not untied.tgt_embed.weight


def test_separate_vocabularies_do_not_share_embeddings():
    model = build_model(ModelConfig(layers=1, d_model=16, heads=2, ffn_dim=32), 30, 50, share_vocab=False)
    assert model.src_embed is not model.tgt_embed
    assert model.output.weight is model.tgt_embed.weight
    src = torch.randint(4, 30, (2, 5))
    logits = model(src, padding_mask(src, 0), torch.randint(4, 50, (2, 4)))
    assert logits.shape == (2, 4, 50)


def test_pre_norm_has_final_layer_norm_and_post_norm_does_not():
    assert isinstance(small_transformer(norm="pre").encoder_norm, torch.nn.LayerNorm)
    assert isinstance(small_transformer(norm="post").encoder_norm, torch.nn.Identity)


def test_sinusoidal_positions_follow_the_formula_and_extend():
    positions = SinusoidalPositions(8, max_positions=4)
    table = positions(6)  # longer than built: the table grows
    assert table.shape == (6, 8)
    assert table[3, 0].item() == pytest.approx(torch.sin(torch.tensor(3.0)).item(), abs=1e-6)
    assert table[3, 1].item() == pytest.approx(torch.cos(torch.tensor(3.0)).item(), abs=1e-6)
    assert table[5, 2].item() == pytest.approx(torch.sin(torch.tensor(5.0 / 10000 ** (2 / 8))).item(), abs=1e-6)


def test_learned_positions_refuse_too_long_inputs():
    positions = LearnedPositions(8, max_positions=4)
    assert positions(4).shape == (4, 8)
    with pytest.raises(MtkitError, match="learned positions"):
        positions(5)


def test_masks():
    assert padding_mask(torch.tensor([[5, 0]]), 0).tolist() == [[True, False]]
    assert causal_mask(3, torch.device("cpu")).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_heads_must_divide_d_model():
    with pytest.raises(MtkitError, match="divisible"):
        Transformer(VOCAB, VOCAB, layers=1, d_model=30, heads=4, ffn_dim=8)


def test_dropout_is_active_only_in_training():
    model = small_transformer(dropout=0.5)
    src, src_mask, tgt = random_batch()
    model.train()
    assert not torch.allclose(model(src, src_mask, tgt), model(src, src_mask, tgt))
    model.eval()
    torch.testing.assert_close(model(src, src_mask, tgt), model(src, src_mask, tgt))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_zeroes_a_share_p_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    x = torch.full((400, 500), 2.0, requires_grad=True)
    out = Dropout(p).train()(x)
    dropped = out.eq(0).float().mean().item()
    assert dropped == pytest.approx(p, abs=0.005)
    kept = out[out.ne(0)]
    torch.testing.assert_close(kept, torch.full_like(kept, 2.0 / (1 - p)))
    out.sum().backward()  # the gradient is the same mask and scale
    torch.testing.assert_close(x.grad, out.detach() / 2.0)


def test_dropout_is_the_identity_in_eval_and_at_zero():
    x = torch.randn(4, 5)
    assert Dropout(0.3).eval()(x) is x
    assert Dropout(0.0).train()(x) is x


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_rate_outside_zero_one_is_a_clear_error(p):
    with pytest.raises(MtkitError, match=r"model.dropout"):
        Dropout(p)
