"""Linear weights laid out once for oneDNN: the same model, the same numbers, used only where exact (in a
loaded model: tests/integration/models/test_packed.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import random_batch, small_transformer
from torch import nn

from mtkit.models import packed as packed_module
from mtkit.models.packed import PackedLinear, pack_linears, packable_linears, row_bucket
from mtkit.models.transformer import Transformer

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
SMALLEST = packed_module.SMALLEST  # as the package sets it, before the fixture below lowers it


@pytest.fixture(autouse=True)
def pack_small_weights(monkeypatch):
    """The test models are tiny: pack every linear, not only those of `SMALLEST` weights and more."""
    monkeypatch.setattr(packed_module, "SMALLEST", 0)


def packed_and_plain(**overrides) -> tuple[nn.Module, nn.Module]:
    packed, plain = small_transformer(**overrides), small_transformer(**overrides)
    assert pack_linears(packed) == sum(type(m) is nn.Linear for m in plain.modules())
    return packed, plain


def logits(model: nn.Module, batch: int = 3) -> torch.Tensor:
    src, src_mask, tgt = random_batch(batch=batch)
    return model(src, src_mask, tgt)


@pytest.mark.parametrize("variant", [{}, {"tie_embeddings": False, "output_bias": True, "activation": "swish"}])
def test_a_packed_model_gives_the_plain_models_logits(variant):
    packed, plain = packed_and_plain(**variant)
    with torch.inference_mode():
        for batch in (1, 3, 11):  # 6, 18 and 66 rows: padded to 8, 24 and 72
            assert torch.allclose(logits(packed, batch), logits(plain, batch), atol=1e-5, rtol=1e-5)
    assert all(isinstance(m, PackedLinear) for m in packed.modules() if isinstance(m, nn.Linear))


def test_an_empty_batch_gives_an_empty_product():
    layer = nn.Linear(16, 32)
    pack_linears(layer)
    with torch.inference_mode():
        assert layer(torch.randn(0, 16)).shape == (0, 32)
        assert layer(torch.randn(2, 0, 16)).shape == (2, 0, 32)


def test_row_buckets_cover_the_rows_with_little_padding_and_are_few():
    for rows in range(1, 5000):
        assert rows <= row_bucket(rows) <= max(rows + 7, rows * 1.125)
    assert len({row_bucket(rows) for rows in range(1, 1025)}) <= 40


def test_a_small_weight_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr(packed_module, "SMALLEST", 64 * 64 + 1)
    model = small_transformer(d_model=64, ffn_dim=128)  # 64 x 64 squares and a 40 x 64 output layer stay plain
    big = [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight.numel() > 64 * 64]
    assert pack_linears(model) == len(big) == 2 * 3 + 2 * 4  # encoder: qkv, ffn x 2; decoder: also cross key/value
    assert all(isinstance(m, PackedLinear) == (m in big) for m in model.modules() if isinstance(m, nn.Linear))


def test_every_linear_of_a_d_model_256_transformer_is_measured_for_packing(monkeypatch):
    """At the Multi30k models' width every layer's product is a candidate: the per-machine measurement
    (`mtkit.models.fast_paths`) decides which run faster packed, not a size fixed for every machine."""
    monkeypatch.setattr(packed_module, "SMALLEST", SMALLEST)
    model = Transformer(1000, 1000, layers=1, d_model=256, heads=4, ffn_dim=1024)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert packable_linears(model) == linears and len(linears) == 12  # encoder 4, decoder 7, output 1


def test_packing_keeps_parameters_state_dict_and_tied_weights():
    packed, plain = packed_and_plain()
    assert packed.output.weight is packed.tgt_embed.weight
    assert packed.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(value, plain.state_dict()[key]) for key, value in packed.state_dict().items())


def test_with_autograd_the_plain_product_runs_and_gradients_flow():
    packed, plain = packed_and_plain()
    packed_logits, plain_logits = logits(packed), logits(plain)
    assert torch.equal(packed_logits, plain_logits)  # F.linear on both sides: bit-identical
    packed_logits.sum().backward()
    assert packed.output.weight.grad is not None


def test_a_weight_changed_after_packing_is_used_as_it_now_is():
    packed, plain = packed_and_plain()
    for model in (packed, plain):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        logits(model).square().mean().backward()
        optimizer.step()
    with torch.inference_mode():
        assert torch.equal(logits(packed), logits(plain))  # stale packed weights are never used
