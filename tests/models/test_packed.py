"""Linear weights laid out once for oneDNN: the same model, the same numbers, used only where exact."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtkit.decoding.translator import Translator
from mtkit.models.packed import PackedLinear, pack_linears
from tests.models.test_transformer import random_batch, small_transformer

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def packed_and_plain(**overrides) -> tuple[nn.Module, nn.Module]:
    packed, plain = small_transformer(**overrides), small_transformer(**overrides)
    assert pack_linears(packed) == sum(type(m) is nn.Linear for m in plain.modules())
    return packed, plain


def logits(model: nn.Module) -> torch.Tensor:
    src, src_mask, tgt = random_batch()
    return model(src, src_mask, tgt)


@pytest.mark.parametrize("variant", [{}, {"tie_embeddings": False, "output_bias": True, "activation": "swish"}])
def test_a_packed_model_gives_the_plain_models_logits(variant):
    packed, plain = packed_and_plain(**variant)
    with torch.inference_mode():
        assert torch.allclose(logits(packed), logits(plain), atol=1e-5, rtol=1e-5)
    assert all(isinstance(m, PackedLinear) for m in packed.modules() if isinstance(m, nn.Linear))


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


def test_a_loaded_translator_decodes_with_packed_weights(reverse_run):
    translator = Translator.load(reverse_run.run_path)
    assert any(isinstance(m, PackedLinear) for m in translator.engine.model.modules())
    plain = Translator.load(reverse_run.run_path)
    for module in plain.engine.model.modules():
        if isinstance(module, PackedLinear):
            module.__class__ = nn.Linear
    sources = ["ein hund läuft", "zwei kinder spielen am strand", "a"]
    for beam in (1, 5):
        assert translator.translate(sources, beam=beam) == plain.translate(sources, beam=beam)
