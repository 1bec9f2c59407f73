"""The output layer fused into the loss gives F.cross_entropy's loss and gradients on the plain logits,
in any chunking, without an (N, V) tensor; the training step computes the same losses with it on."""

from __future__ import annotations

import pytest
import torch
from helpers import LOSS_ROWS, assert_close_to_scale, fused_loss, loss_inputs, plain_loss, value_and_grads
from torch.utils._python_dispatch import TorchDispatchMode

from mtkit.config import TrainConfig, apply_override, config_from_dict
from mtkit.data.tokenizer import PAD_ID
from mtkit.distributed import Distributed
from mtkit.models.rnn import RNNSeq2Seq
from mtkit.models.transformer import Transformer
from mtkit.training.fused_loss import FusedTeacherForcing, chunks_for, fused_loss_on, output_layer_loss
from mtkit.training.levers import Levers
from mtkit.training.loss import TeacherForcing
from mtkit.training.trainer import training_forward

CPU = torch.device("cpu")


@pytest.mark.parametrize("chunks", [1, 4, 5, 7, LOSS_ROWS, LOSS_ROWS + 9])  # dividing N (1, 4, 24) or not; more than N
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("tied", [True, False])
def test_fp32_loss_and_gradients_match_cross_entropy_on_the_logits(chunks, smoothing, with_bias, tied):
    hidden, weight, bias, target, ids = loss_inputs()
    arguments = (hidden, weight, bias if with_bias else None, target, smoothing, ids if tied else None)
    expected = value_and_grads(plain_loss, *arguments)
    found = value_and_grads(fused_loss(chunks), *arguments)
    for name, got, want in zip(("loss", "hidden", "weight", "bias"), found, expected, strict=True):
        if want is None:
            assert got is None
            continue
        assert got.dtype == want.dtype and got.shape == want.shape
        assert_close_to_scale(got, want, 1e-5, name)
    assert found[1][target.eq(PAD_ID)].abs().max() == 0  # pad rows get exactly no gradient


# bf16 keeps 8 significant bits: each product and each stored gradient is rounded to a relative 2^-8 (0.4%)
# of its size, and the chunked products add in another order than the whole ones, so an entry may be a
# rounding or two away; 2^-6 (1.6%, four roundings) of the tensor's largest entry bounds that with room.
# The loss adds fp32 terms of bf16 logits, a few of which may differ by one rounding: a relative 1e-4 of the sum.
BF16_RELATIVE = 2**-6


@pytest.mark.parametrize("autocast", [True, False])  # fp32 weights under autocast (a step's), or all in bf16
def test_bf16_loss_and_gradients_match_cross_entropy_within_bf16_rounding(autocast):
    hidden, weight, bias, target, ids = loss_inputs(torch.bfloat16)
    weight, bias = (weight.float(), bias.float()) if autocast else (weight, bias)
    arguments = (hidden, weight, bias, target, 0.1, ids)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        expected = value_and_grads(plain_loss, *arguments)
        found = value_and_grads(fused_loss(5, torch.bfloat16), *arguments)
    assert_close_to_scale(found[0], expected[0], 1e-4, "loss")
    for name, got, want in zip(("hidden", "weight", "bias"), found[1:], expected[1:], strict=True):
        assert got.dtype == want.dtype
        assert_close_to_scale(got, want, BF16_RELATIVE, name)
    assert found[1][target.eq(PAD_ID)].abs().max() == 0


def test_gradcheck_in_float64():
    hidden, weight, bias, target, _ = (t[:7] if t.dim() else t for t in loss_inputs(torch.float64))
    hidden, weight, bias = hidden[:, :3].clone(), weight[:5, :3].clone(), bias[:5].clone()
    target = target.remainder(5)
    target[2] = PAD_ID
    leaves = [t.requires_grad_(True) for t in (hidden, weight, bias)]
    assert torch.autograd.gradcheck(
        lambda h, w, b: output_layer_loss(h, w, bias=b, target=target, label_smoothing=0.1, chunks=3), leaves
    )


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operation returns while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in result if isinstance(result, (tuple, list)) else [result]:
            self.elements = max(self.elements, value.numel() if isinstance(value, torch.Tensor) else 0)
        return result


def test_nothing_of_tokens_by_vocabulary_is_allocated_or_saved():
    rows, dim, vocab, chunks = 96, 4, 64, 8  # N x V = 6144; a chunk's logits 12 x 64 = 768; W 256
    hidden = torch.randn(rows, dim, requires_grad=True)
    weight, target = torch.randn(vocab, dim, requires_grad=True), torch.randint(0, vocab, (rows,))
    saved: list[int] = []
    with (
        torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t),
        LargestTensor() as largest,
    ):
        output_layer_loss(hidden, weight, bias=None, target=target, label_smoothing=0.1, chunks=chunks).backward()
    assert max(saved) <= max(rows * dim, vocab * dim)  # grad_h (N, D), grad_W (V, D)
    assert largest.elements <= rows // chunks * vocab
    assert chunks_for(8000, 512) == 16 and chunks_for(64000, 512) == 32 and chunks_for(10, 512) == 1


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_final_states_through_the_output_layer_are_the_logits(arch):
    torch.manual_seed(0)
    model = tiny_model(arch).eval()
    src, tgt = torch.randint(3, 30, (3, 6)), torch.randint(3, 30, (3, 5))
    src_mask = src.ne(PAD_ID)
    memory = model.encode(src, src_mask)
    torch.testing.assert_close(model.output(model.final_states(tgt, memory, src_mask=src_mask)), model(src, src_mask, tgt))


@pytest.mark.parametrize(
    ("value", "device", "on"), [("auto", "cpu", False), ("auto", "cuda", False), ("true", "cpu", True), ("true", "cuda", True)]
)
def test_the_lever_is_on_only_when_asked(value, device, on):
    assert fused_loss_on(TrainConfig(fused_loss=value), torch.device(device)) is on


def test_the_recipe_key_takes_on_and_off():
    raw: dict = {}
    apply_override(raw, "train.fused_loss=on")  # YAML's on is true
    assert config_from_dict(raw, source="recipe").train.fused_loss == "true"


@pytest.mark.parametrize("arch", ["transformer", "rnn"])
def test_training_with_the_fused_loss_takes_the_same_steps(arch):
    """A few Adam updates of a tiny model (tied embeddings, dropout on) through `training_forward`:
    the same losses with `train.fused_loss` on as off, within fp32 rounding."""
    losses = {}
    for fused in ("true", "false"):
        torch.manual_seed(0)
        model = tiny_model(arch).train()
        config = TrainConfig(fused_loss=fused, label_smoothing=0.1)
        step = training_forward(model, config, distributed=Distributed(), device=CPU, levers=Levers.of(config, CPU))
        assert type(step) is (FusedTeacherForcing if fused == "true" else TeacherForcing)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses[fused] = []
        for _ in range(4):
            src, tgt = torch.randint(3, 30, (4, 7)), torch.randint(3, 30, (4, 6))
            src[0, 5:], tgt[1, 4:] = PAD_ID, PAD_ID
            loss = step(src, src.ne(PAD_ID), tgt[:, :-1], tgt[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses[fused].append(loss.item())
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-5)


def tiny_model(arch: str) -> torch.nn.Module:
    if arch == "transformer":
        return Transformer(30, 30, layers=1, d_model=16, heads=2, ffn_dim=32, output_bias=True)
    return RNNSeq2Seq(30, 30, layers=1, hidden_size=16, embed_dim=8, attention="luong_general", input_feed=True)
