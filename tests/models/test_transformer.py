"""The Transformer honours the model contract: shapes, masking, causality, incremental decoding;
its attention layers cache keys/values and give the heatmaps' weights from their own forward."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import SMALL_VOCAB, random_batch, small_transformer
from torch import Tensor

from mtkit.config import ModelConfig
from mtkit.errors import MtkitError
from mtkit.models import build_model
from mtkit.models.base import causal_mask, padding_mask
from mtkit.models.layers import CrossAttention, Dropout, LearnedPositions, SelfAttention, SinusoidalPositions
from mtkit.models.transformer import Transformer


def padded_batch(row: int, start: int, batch: int = 3):
    """`random_batch` with sentence `row` padded from position `start` on, and its padding mask."""
    src, _, tgt = random_batch(batch=batch)
    src[row, start:] = 0
    return src, padding_mask(src, 0), tgt


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
    logits, state = model.decode(tgt, memory, src_mask=src_mask, state=None)
    assert memory.shape == (3, 7, 32)
    assert logits.shape == (3, 6, SMALL_VOCAB)
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
    src, src_mask, tgt = padded_batch(1, 4, batch=2)
    alone = model(src[:1], src_mask[:1], tgt[:1])
    together = model(src, src_mask, tgt)
    torch.testing.assert_close(together[:1], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_future_target_token_does_not_change_earlier_logits(variant):
    model = small_transformer(**variant)
    src, src_mask, tgt = random_batch()
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 4) % (SMALL_VOCAB - 4) + 4
    before = model(src, src_mask, tgt)
    after = model(src, src_mask, changed)
    torch.testing.assert_close(after[:, :4], before[:, :4], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(after[:, 4:], before[:, 4:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_incremental_decoding_equals_full_decoding(variant):
    model = small_transformer(**variant)
    src, src_mask, tgt = padded_batch(0, 5)
    full = model(src, src_mask, tgt)
    memory = model.encode(src, src_mask)
    state: dict = {}
    steps = []
    for position in range(tgt.size(1)):
        logits, state = model.decode(tgt[:, position : position + 1], memory, src_mask=src_mask, state=state)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # Several new tokens at once on top of a cache (a prefix, then the rest) also agree.
    _, cached = model.decode(tgt[:, :2], memory, src_mask=src_mask, state={})
    rest, _ = model.decode(tgt[:, 2:], memory, src_mask=src_mask, state=cached)
    torch.testing.assert_close(rest, full[:, 2:], atol=1e-5, rtol=1e-5)


def test_reorder_state_follows_the_batch_order():
    model = small_transformer()
    src, src_mask, tgt = random_batch()
    memory = model.encode(src, src_mask)
    _, state = model.decode(tgt[:, :3], memory, src_mask=src_mask, state={})
    order = torch.tensor([2, 0])
    reordered = model.reorder_state(state, order)
    next_logits, _ = model.decode(tgt[order, 3:4], memory[order], src_mask=src_mask[order], state=reordered)
    full = model(src[order], src_mask[order], tgt[order, :4])
    torch.testing.assert_close(next_logits[:, 0], full[:, 3], atol=1e-5, rtol=1e-5)


def attention_inputs(batch: int = 2, tgt_len: int = 5, src_len: int = 7) -> tuple[Tensor, Tensor, Tensor]:
    """Random decoder states (B, T, 32), memory (B, S, 32) and a memory mask with padding in row 1."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(batch, tgt_len, 32, generator=generator)
    memory = torch.randn(batch, src_len, 32, generator=generator)
    memory_mask = torch.ones(batch, 1, 1, src_len, dtype=torch.bool)
    memory_mask[1, ..., 4:] = False
    return x, memory, memory_mask


def reference_cross_weights(attention: CrossAttention, x: Tensor, memory: Tensor, memory_mask: Tensor) -> Tensor:
    """softmax(Q K^T / sqrt(Dh)) per head, from the layer's parameters, masked keys excluded."""
    heads, head_dim = attention.heads, attention.head_dim
    query = x @ attention.query.weight.T + attention.query.bias
    key = memory @ attention.key_value.weight[: heads * head_dim].T + attention.key_value.bias[: heads * head_dim]
    query = query.view(x.size(0), x.size(1), heads, head_dim).permute(0, 2, 1, 3)  # (B, H, T, Dh)
    key = key.view(memory.size(0), memory.size(1), heads, head_dim).permute(0, 2, 1, 3)  # (B, H, S, Dh)
    scores = torch.einsum("bhtd,bhsd->bhts", query, key) / head_dim**0.5  # (B, H, T, S)
    return torch.softmax(scores.masked_fill(~memory_mask, float("-inf")), dim=-1)


def test_attention_forward_shapes():
    torch.manual_seed(0)
    x, memory, memory_mask = attention_inputs()
    key_mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    assert SelfAttention(32, 4, dropout=0.0, causal=False).eval()(x, key_mask).shape == (2, 5, 32)
    assert SelfAttention(32, 4, dropout=0.0, causal=True).eval()(x).shape == (2, 5, 32)
    cross = CrossAttention(32, 4, dropout=0.0).eval()
    output, weights = cross(x, memory, memory_mask)
    assert output.shape == (2, 5, 32) and weights is None
    output_with_weights, weights = cross(x, memory, memory_mask, need_weights=True)
    assert weights.shape == (2, 4, 5, 7) and weights.dtype == torch.float32
    # The explicit path (for heatmaps) attends exactly like the fused fast path.
    torch.testing.assert_close(output_with_weights, output, atol=1e-5, rtol=1e-5)


def test_self_attention_cache_equals_full_causal_attention():
    torch.manual_seed(0)
    attention = SelfAttention(32, 4, dropout=0.0, causal=True).eval()
    x, _, _ = attention_inputs()
    full = attention(x)
    cache: dict = {}
    steps = [attention(x[:, position : position + 1], cache=cache, prefix="3.") for position in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert sorted(cache) == ["3.self_k", "3.self_v"] and cache["3.self_k"].shape == (2, 4, 5, 8)
    # A prefix of several positions, then the rest on top of its cache, also agrees.
    cache = {}
    first, rest = attention(x[:, :2], cache=cache), attention(x[:, 2:], cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-5, rtol=1e-5)


def test_cross_attention_projects_the_memory_once_into_the_cache():
    torch.manual_seed(0)
    attention = CrossAttention(32, 4, dropout=0.0).eval()
    x, memory, memory_mask = attention_inputs()
    cache: dict = {}
    first, _ = attention(x[:, :1], memory, memory_mask, cache, "0.")
    assert sorted(cache) == ["0.cross_k", "0.cross_v"] and cache["0.cross_k"].shape == (2, 4, 7, 8)
    # Later steps read the cache, not the memory.
    second, _ = attention(x[:, 1:2], torch.zeros_like(memory), memory_mask, cache, "0.")
    full, _ = attention(x[:, :2], memory, memory_mask)
    torch.testing.assert_close(torch.cat([first, second], dim=1), full, atol=1e-5, rtol=1e-5)


def test_cross_attention_weights_equal_the_reference_computation():
    torch.manual_seed(0)
    attention = CrossAttention(32, 4, dropout=0.0).eval()
    x, memory, memory_mask = attention_inputs()
    _, weights = attention(x, memory, memory_mask, need_weights=True)
    torch.testing.assert_close(weights, reference_cross_weights(attention, x, memory, memory_mask), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_model_cross_attention_is_the_last_layers_weights_in_its_own_forward(variant):
    model = small_transformer(**variant)
    src, src_mask, tgt = padded_batch(1, 4)
    memory = model.encode(src, src_mask)
    seen = {}
    last = model.decoder_layers[-1].cross_attention
    hook = last.register_forward_hook(lambda module, args, output: seen.update(x=args[0], memory=args[1]))
    model.decode(tgt, memory, src_mask=src_mask)
    hook.remove()
    weights = model.cross_attention(tgt, memory, src_mask=src_mask)
    assert weights.shape == (3, 4, 6, 7)
    reference = reference_cross_weights(last, seen["x"], seen["memory"], src_mask[:, None, None, :])
    torch.testing.assert_close(weights, reference, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 6))
    assert weights[1, ..., 4:].eq(0).all()


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
    model = build_model(ModelConfig(layers=1, d_model=16, heads=2, ffn_dim=32), 30, tgt_vocab_size=50, share_vocab=False)
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
        Transformer(SMALL_VOCAB, SMALL_VOCAB, layers=1, d_model=30, heads=4, ffn_dim=8)


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
    dropout = Dropout(p).train()
    out = dropout(x)
    assert dropout.cpu_p == pytest.approx(p, abs=0.5 / 65536)  # p rounded to 16 bits on CPU
    dropped = out.eq(0).float().mean().item()
    assert dropped == pytest.approx(p, abs=0.005)
    # each of the four 16-bit numbers cut from one 64-bit draw drops its share (none is biased)
    for lane in range(4):
        assert out.flatten()[lane::4].eq(0).float().mean().item() == pytest.approx(p, abs=0.01)
    kept = out[out.ne(0)]
    torch.testing.assert_close(kept, torch.full_like(kept, 2.0 / (1 - dropout.cpu_p)))
    assert out.mean().item() == pytest.approx(2.0, rel=0.02)  # the expectation is kept
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


def test_the_default_keys_build_the_same_parameters_and_outputs_as_before():
    """activation relu, depths 0 (= layers), no output bias: the parameters and outputs of a model without these keys."""
    plain, explicit = (
        small_transformer(),
        small_transformer(activation="relu", encoder_layers=0, decoder_layers=0, output_bias=False),
    )
    assert [(n, p.shape) for n, p in plain.named_parameters()] == [(n, p.shape) for n, p in explicit.named_parameters()]
    assert "output.bias" not in dict(plain.named_parameters())
    src, src_mask, tgt = random_batch()
    torch.testing.assert_close(plain(src, src_mask, tgt), explicit(src, src_mask, tgt), rtol=0, atol=0)


@pytest.mark.parametrize(("activation", "function"), [("gelu", torch.nn.functional.gelu), ("swish", torch.nn.functional.silu)])
def test_the_feed_forward_applies_the_chosen_activation(activation, function):
    model = small_transformer(activation=activation)
    block = model.encoder_layers[0].feed_forward
    x = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(block(x), block.outer(function(block.inner(x))))
    assert not torch.allclose(block(x), block.outer(torch.relu(block.inner(x))))


def test_encoder_and_decoder_depths_of_their_own_and_the_output_bias():
    model = small_transformer(encoder_layers=1, decoder_layers=3, output_bias=True)
    assert (len(model.encoder_layers), len(model.decoder_layers), model.attention_layers) == (1, 3, 3)
    with torch.no_grad():
        model.output.bias.copy_(torch.arange(SMALL_VOCAB, dtype=torch.float32))
    src, src_mask, tgt = random_batch()
    memory = model.encode(src, src_mask)
    hidden, _ = model._run_decoder(tgt, memory, src_mask, None)
    expected = model.decoder_norm(hidden) @ model.output.weight.T + torch.arange(SMALL_VOCAB, dtype=torch.float32)
    torch.testing.assert_close(model(src, src_mask, tgt), expected)


def test_sinusoids_in_halves_are_marians_layout_in_float64():
    d_model, length = 6, 5
    table = SinusoidalPositions(d_model, max_positions=2, halves=True)(length)  # grows past the built table
    for position in range(length):
        angles = [position / 10000 ** (2 * (j // 2) / d_model) for j in range(d_model)]
        expected = [math.sin(angles[j]) for j in range(0, d_model, 2)] + [math.cos(angles[j]) for j in range(1, d_model, 2)]
        assert table[position].tolist() == pytest.approx(expected, abs=1e-7)
    interleaved = SinusoidalPositions(d_model, max_positions=5)(length)
    assert not torch.equal(table, interleaved)


def test_the_new_model_keys_are_checked_at_load():
    from mtkit.config import config_from_dict

    for key, value, needle in (("activation", "tanh", "model.activation"), ("encoder_layers", -1, "model.encoder_layers")):
        with pytest.raises(MtkitError, match=needle):
            config_from_dict({"name": "x", "model": {"arch": "transformer", key: value}})
    with pytest.raises(MtkitError, match="model.output_bias"):
        config_from_dict({"name": "x", "model": {"arch": "rnn", "output_bias": True}})
    built = build_model(
        ModelConfig(d_model=32, heads=4, ffn_dim=64, layers=2, decoder_layers=1, positions="sinusoidal_halves"),
        20,
        tgt_vocab_size=20,
        share_vocab=True,
    )
    assert len(built.encoder_layers) == 2 and len(built.decoder_layers) == 1 and built.src_positions.halves
