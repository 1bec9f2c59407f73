"""LoRA's layers on mtkit's Transformer (mtkit.models.lora): the parent's outputs at the start, only adapters trained,
a merge that computes what the adapters did (a tied output layer included), the parent's digest, and the recipe's
train.lora keys checked in one line each. peft as the reference: tests/models/test_lora_peft.py."""

from __future__ import annotations

import pytest
import torch
from helpers import random_batch, recipe, small_transformer

from mtkit.config import LORA_TARGETS, LoraConfig, config_from_dict
from mtkit.errors import MtkitError
from mtkit.models.lora import (
    LoraEmbedding,
    LoraLinear,
    adapter_weights,
    apply_lora,
    load_base_weights,
    merge_lora,
    weights_digest,
)

EVERY_TARGET = list(LORA_TARGETS)


def _randomised(model: torch.nn.Module, seed: int = 0) -> None:
    """Every adapter drawn at random (B too): the adapted model then differs from its parent."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in adapter_weights(model).values():
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2)


@pytest.mark.parametrize("targets", [["qkv"], ["query", "key_value", "out"], ["inner", "outer"], EVERY_TARGET])
def test_an_adapted_model_starts_as_its_parent_and_trains_only_its_adapters(targets):
    model = small_transformer()
    src, mask, tgt = random_batch()
    parent = model(src, mask, tgt)
    frozen = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    trained = apply_lora(model, LoraConfig(rank=4, targets=targets))
    torch.testing.assert_close(model(src, mask, tgt), parent, rtol=0, atol=0)  # B (an embedding's A) starts at zero
    names = {name for name, p in model.named_parameters() if p.requires_grad}
    assert names == set(adapter_weights(model)) and trained == sum(p.numel() for p in adapter_weights(model).values())
    assert {name.rsplit(".", 2)[-2] for name in names} == {"embedding" if t == "embedding" else t for t in targets}
    assert {name: t for name, t in model.state_dict().items() if name in frozen}.keys() == frozen.keys()


def test_a_fused_projection_holds_one_adapter_per_projection_it_fuses():
    model = small_transformer()
    apply_lora(model, LoraConfig(rank=3, targets=["qkv", "key_value", "query"]))
    qkv, key_value = model.encoder_layers[0].self_attention.qkv, model.decoder_layers[0].cross_attention.key_value
    assert (qkv.lora_A.shape, qkv.lora_B.shape) == ((9, 32), (96, 3))
    assert (key_value.lora_A.shape, key_value.lora_B.shape) == ((6, 32), (64, 3))
    _randomised(model)
    x = torch.randn(2, 5, 32)
    query, key, value = qkv(x).chunk(3, dim=-1)
    # the key's delta is its own B block times its own A block: nothing of the query's or the value's
    own = x @ qkv.lora_A[3:6].T @ qkv.lora_B[32:64].T * qkv.scaling
    torch.testing.assert_close(key, x @ qkv.weight[32:64].T + qkv.bias[32:64] + own)


@pytest.mark.parametrize("tied", [True, False])
def test_merging_computes_what_the_adapters_did_and_keeps_the_parent_s_names_and_ties(tied):
    model = small_transformer(tie_embeddings=tied, output_bias=True)
    names = set(model.state_dict())
    apply_lora(model, LoraConfig(rank=4, alpha=8.0, targets=EVERY_TARGET))
    assert isinstance(model.output, LoraLinear) == tied  # the output layer shares the adapted table only when tied
    _randomised(model)
    src, mask, tgt = random_batch()
    adapted = model(src, mask, tgt)
    parent = small_transformer(tie_embeddings=tied, output_bias=True)(src, mask, tgt)
    assert (adapted - parent).abs().max() > 1.0  # the adapters change the outputs: the comparison below can fail
    # 4 adapted layers an encoder layer, 7 a decoder layer; one table and its output layer, or two tables
    assert merge_lora(model) == 2 * 4 + 2 * 7 + 2
    assert not any(isinstance(m, (LoraLinear, LoraEmbedding)) for m in model.modules())
    assert set(model.state_dict()) == names
    assert (model.output.weight is model.tgt_embed.weight) == tied
    torch.testing.assert_close(model(src, mask, tgt), adapted, rtol=1e-5, atol=1e-4)


def test_the_digest_changes_with_any_weight_and_with_nothing_else():
    weights = small_transformer().state_dict()
    digest = weights_digest(weights)
    assert weights_digest({name: tensor.clone() for name, tensor in reversed(weights.items())}) == digest
    changed = dict(weights) | {"output.weight": weights["output.weight"].clone()}
    changed["output.weight"][3, 4] += 1e-6
    assert weights_digest(changed) != digest
    assert weights_digest(dict(weights) | {"output.weight": weights["output.weight"].double()}) != digest


def _lora_recipe(tmp_path, lora: object, **train: object) -> dict:
    return recipe("child", tmp_path, train={"init_from": str(tmp_path / "parent"), "lora": lora, **train})


@pytest.mark.parametrize(
    ("lora", "train", "needles"),
    [
        ({"targets": ["qkv", "attention"]}, {}, ["'train.lora.targets'", "'attention' is not a layer", "key_value, out"]),
        ({"targets": "qkv,out"}, {}, ["'train.lora.targets'", "give a list of layer names, such as [qkv, out]"]),
        ({"targets": ["qkv", "qkv"]}, {}, ["give each layer name once"]),
        ({"rank": 0}, {}, ["'train.lora.rank' is 0", "give a whole number in [1, 65536]"]),
        ({"alpha": 0}, {}, ["'train.lora.alpha' is 0.0", "give a number in (0, 1000000]"]),
        ({"ranks": 8}, {}, ["unknown key 'train.lora.ranks'", "did you mean 'train.lora.rank'"]),
        ({"bf16_base": "yes"}, {}, ["'train.lora.bf16_base' is 'yes'", "choose one of auto, true, false"]),
        ({}, {"init_from": None}, ["'train.lora' is set", "set train.init_from"]),
        ({}, {"freeze": "encoder"}, ["'train.lora' is set", "remove train.freeze"]),
        ({}, {"ema": 0.999}, ["'train.lora' is set", "train.ema and train.average_last"]),
        ({"targets": ["embedding"]}, {"fused_loss": "true"}, ["train.fused_loss reads the output weight"]),
        ({"bf16_base": "true"}, {"device": "cpu"}, ["a bf16 base needs train.precision bf16 on CUDA"]),
    ],
)
def test_a_bad_lora_key_is_one_line_naming_it(tmp_path, lora, train, needles):
    with pytest.raises(MtkitError) as raised:
        config_from_dict(_lora_recipe(tmp_path, lora, **train), source="child.yaml")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("child.yaml: ")
    for needle in needles:
        assert needle in message, message


def test_an_rnn_parent_is_refused_by_its_architecture(tmp_path):
    rnn = recipe("child", tmp_path, model={"arch": "rnn", "d_model": None, "heads": None, "ffn_dim": None})
    rnn["train"] |= {"init_from": str(tmp_path / "parent"), "lora": {}}
    with pytest.raises(MtkitError, match=r"^child.yaml: 'train.lora' is set; it adapts a Transformer's layers"):
        config_from_dict(rnn, source="child.yaml")


def test_lora_keys_default_and_are_saved_with_the_run(tmp_path):
    config = config_from_dict(_lora_recipe(tmp_path, {"rank": 16}))
    assert config.train.lora == LoraConfig(rank=16)
    assert config.train.lora.targets == ["qkv", "query", "key_value", "out"] and config.train.lora.alpha == 16.0
    assert config_from_dict(recipe("plain", tmp_path)).train.lora is None


def test_a_bf16_base_holds_the_frozen_matrices_in_bf16_and_trains_fp32_adapters_under_autocast():
    model = small_transformer().train()
    parent = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    apply_lora(model, LoraConfig(rank=4, targets=EVERY_TARGET), bf16_base=True)
    frozen = {name: p for name, p in model.named_parameters() if not p.requires_grad}
    assert {name for name, p in frozen.items() if p.dtype == torch.bfloat16} == {n for n, p in frozen.items() if p.dim() == 2}
    load_base_weights(model, parent)  # a parent's fp32 weights are cast into the bf16 base
    assert model.output.weight.dtype == torch.bfloat16
    torch.testing.assert_close(model.output.weight.float(), parent["output.weight"], rtol=1e-2, atol=1e-2)
    src, mask, tgt = random_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what CUDA's bf16 precision does, on the CPU
        model(src, mask, tgt).float().sum().backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 and p.grad is not None for p in trained)
    assert model.encoder_layers[0].self_attention.qkv.lora_B.grad.abs().sum() > 0  # B's (A's is 0 while B is)
