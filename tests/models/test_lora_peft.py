"""mtkit's LoRA against peft's on the same model: a tiny random Hugging Face model of each family mtkit imports
(Marian, NLLB-200, M2M-100, mBART-50) imported into mtkit, both adapted on every attention projection and
feed-forward layer with the same A and B values (B non-zero), and the loss of one batch and every adapter's
gradient compared within 1e-5 (fp32)."""

from __future__ import annotations

import itertools

import pytest
import torch
from fairseq_builder import build
from marian_builder import build_marian

from mtkit.config import LoraConfig
from mtkit.data.tokenizer import BOS_ID
from mtkit.importers import import_model
from mtkit.importers.fairseq import fairseq_vocab
from mtkit.importers.marian import read_marian
from mtkit.importers.names import depths, layer_names
from mtkit.models.checkpoint import load_model
from mtkit.models.lora import apply_lora

pytestmark = [
    pytest.mark.usefixtures("transformers_installed"),  # shared_fixtures.py
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]
TARGETS = {"qkv": "q_proj k_proj v_proj", "query": "q_proj", "key_value": "k_proj v_proj", "out": "out_proj"}
TARGETS |= {"inner": "fc1", "outer": "fc2"}  # mtkit's module names -> Marian's


@pytest.fixture(scope="module", params=["marian", "nllb", "m2m100", "mbart"])
def both(request, tmp_path_factory: pytest.TempPathFactory):
    """(mtkit's import with its LoRA, transformers' model with peft's, each mtkit id's id in transformers' vocabulary,
    the pairs of adapter tensors that hold the same values, the layers a side)."""
    from peft import LoraConfig as PeftConfig
    from peft import get_peft_model
    from transformers import AutoModelForSeq2SeqLM

    folder = tmp_path_factory.mktemp(request.param) / "model"
    if request.param == "marian":
        build_marian(folder)
    else:
        build(request.param, folder)
    run = folder.parent / "run"
    import_model(str(folder), run)
    mtkit_model, config, tokenizers, _ = load_model(run)
    rows = tokenizers.tgt.vocab_size  # fairseq's order of pieces, read from mtkit's table: one id too many at its end
    order = read_marian(folder).target.order if request.param == "marian" else fairseq_vocab(tokenizers.tgt.table).order[:rows]
    lora = LoraConfig(rank=4, alpha=8.0, targets=list(TARGETS))
    apply_lora(mtkit_model, lora)
    theirs = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32)
    targets = sorted({name for names in TARGETS.values() for name in names.split()})
    peft_model = get_peft_model(theirs, PeftConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=0.0, target_modules=targets))
    pairs = _adapter_pairs(mtkit_model, peft_model, config.model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter, block, blocks, peft_tensor in pairs:
            values = parameter.chunk(blocks)[block]
            values.copy_(torch.randn(values.shape, generator=generator) * 0.3)  # B too: a zero B would hide its gradient
            peft_tensor.copy_(values)
    return mtkit_model.eval(), peft_model.eval(), order, pairs, depths(config.model)


def _adapter_pairs(mtkit_model, peft_model, model_config) -> list[tuple[torch.Tensor, int, int, torch.Tensor]]:
    """Each adapter block of mtkit's (a fused projection's A and B hold one block of rows per projection) beside the
    peft parameter of the same projection, by the importer's own name table: (parameter, block, blocks, peft's)."""
    mine = dict(mtkit_model.named_parameters())
    peft = dict(peft_model.named_parameters())
    pairs = []
    for name, marian_names in layer_names(model_config):
        layer = name.removesuffix(".weight")
        if not name.endswith(".weight") or f"{layer}.lora_A" not in mine:
            continue
        for matrix, (block, marian) in itertools.product(("lora_A", "lora_B"), enumerate(marian_names)):
            theirs = peft[f"base_model.model.model.{marian.removesuffix('.weight')}.{matrix}.default.weight"]
            pairs.append((mine[f"{layer}.{matrix}"], block, len(marian_names), theirs))
    return pairs


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean negative log-likelihood of the labels a token."""
    return -torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).mean()


def test_loss_and_every_adapter_gradient_equal_peft_s_within_1e_5(both) -> None:
    mtkit_model, peft_model, order, pairs, (encoder, decoder) = both
    assert len(pairs) == 2 * (6 * encoder + 10 * decoder)  # A and B of each projection: 6 an encoder layer, 10 a decoder
    generator = torch.Generator().manual_seed(1)
    words = torch.arange(4, len(order))  # mtkit's ids of real pieces (no pad, unk, BOS or EOS)
    src = words[torch.randint(len(words), (3, 9), generator=generator)]
    labels = words[torch.randint(len(words), (3, 7), generator=generator)]
    tgt = torch.cat([torch.full((3, 1), BOS_ID), labels[:, :-1]], dim=1)
    marian = torch.tensor(order)  # transformers' id of each mtkit id; BOS is its decoder start
    columns = torch.tensor([index for index in range(len(order)) if index != BOS_ID])  # it has no BOS column of its own

    found = mtkit_model(src, src.ne(0), tgt)[..., columns]
    expected = peft_model(input_ids=marian[src], decoder_input_ids=marian[tgt]).logits[..., marian[columns]]
    position = {int(column): index for index, column in enumerate(columns)}
    column_labels = torch.tensor([[position[int(label)] for label in row] for row in labels])
    mine, theirs = _loss(found, column_labels), _loss(expected, column_labels)
    mine.backward()
    theirs.backward()

    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
    for parameter, block, blocks, peft_tensor in pairs:
        assert peft_tensor.grad is not None and peft_tensor.grad.abs().max() > 0
        torch.testing.assert_close(parameter.grad.chunk(blocks)[block], peft_tensor.grad, rtol=0, atol=1e-5)
