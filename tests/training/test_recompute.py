"""`train.checkpoint_activations` (mtkit.training.recompute): the layers recompute their activations in the backward
pass, so the forward pass keeps less, and the loss and gradients are the plain step's, dropout included."""

from __future__ import annotations

import copy

import pytest
import torch

from mtkit.config import load_config
from mtkit.data.tokenizer import PAD_ID
from mtkit.errors import MtkitError
from mtkit.models.rnn import RNNSeq2Seq
from mtkit.models.transformer import Transformer
from mtkit.training.loss import TeacherForcing
from mtkit.training.recompute import recompute_blocks


def batch() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(3, 40, (4, 9), generator=generator), torch.randint(3, 40, (4, 8), generator=generator)
    src[0, 5:], tgt[1, 4:] = PAD_ID, PAD_ID
    return src, src.ne(PAD_ID), tgt[:, :-1], tgt[:, 1:]


def loss_grads_and_saved_bytes(step: TeacherForcing) -> tuple[float, dict[str, torch.Tensor], int]:
    saved = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    torch.manual_seed(7)  # the same dropout masks for both models
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        loss = step(*batch())
    loss.backward()
    return loss.item(), {name: p.grad for name, p in step.model.named_parameters()}, sum(saved)


@pytest.fixture(scope="module")
def models() -> tuple[Transformer, Transformer]:
    torch.manual_seed(0)
    plain = Transformer(40, 40, layers=3, d_model=32, heads=4, ffn_dim=64, dropout=0.1, output_bias=True)
    recomputed = copy.deepcopy(plain)
    assert recompute_blocks(recomputed) == 6
    return plain, recomputed


def test_the_loss_and_gradients_are_the_plain_steps_with_dropout(models):
    plain, recomputed = models
    loss, grads, _ = loss_grads_and_saved_bytes(TeacherForcing(plain.train(), 0.1, amp_dtype=None, fused=False))
    loss_r, grads_r, _ = loss_grads_and_saved_bytes(TeacherForcing(recomputed.train(), 0.1, amp_dtype=None, fused=False))
    assert loss_r == pytest.approx(loss, rel=1e-6)
    for name, grad in grads.items():
        assert (grads_r[name] - grad).abs().max() <= 1e-6 * grad.abs().max(), name


def test_the_forward_pass_keeps_less(models):
    plain, recomputed = models
    *_, kept = loss_grads_and_saved_bytes(TeacherForcing(plain.train(), 0.1, amp_dtype=None, fused=False))
    *_, kept_recomputed = loss_grads_and_saved_bytes(TeacherForcing(recomputed.train(), 0.1, amp_dtype=None, fused=False))
    assert kept_recomputed < 0.5 * kept, (kept_recomputed, kept)


def test_names_stay_and_decoding_runs_the_layers_as_they_are(models):
    plain, recomputed = models
    assert list(recomputed.state_dict()) == list(plain.state_dict())
    src, src_mask, tgt, _ = batch()
    with torch.no_grad():
        torch.testing.assert_close(recomputed.eval()(src, src_mask, tgt), plain.eval()(src, src_mask, tgt))


def test_a_model_without_layers_is_refused_in_one_line():
    model = RNNSeq2Seq(30, 30, layers=1, hidden_size=16, embed_dim=8, attention="luong_general", input_feed=True)
    with pytest.raises(MtkitError, match="train.checkpoint_activations: a RNNSeq2Seq model has no repeated layers"):
        recompute_blocks(model)


def test_the_recipe_key():
    assert load_config("recipes/multi30k/transformer.yaml", ["train.checkpoint_activations=true"]).train.checkpoint_activations
