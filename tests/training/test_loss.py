"""The fused label-smoothed loss gives F.cross_entropy's value and gradient, in any chunking."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mtkit.training.loss
from mtkit.data.tokenizer import PAD_ID
from mtkit.training.loss import sequence_loss


def reference(logits: torch.Tensor, target: torch.Tensor, *, label_smoothing: float) -> torch.Tensor:
    flat = logits.reshape(-1, logits.size(-1))
    return F.cross_entropy(flat, target.reshape(-1), ignore_index=PAD_ID, label_smoothing=label_smoothing, reduction="sum")


def value_and_grad(loss_fn, logits: torch.Tensor, target: torch.Tensor, smoothing: float):
    logits = logits.detach().clone().requires_grad_(True)
    loss = loss_fn(logits, target, label_smoothing=smoothing)
    (2.5 * loss).backward()  # a grad_output other than 1 must scale the gradient
    return loss.detach(), logits.grad


@pytest.mark.parametrize("chunk_elements", [1, 3 * 11, 1 << 19])  # one row a chunk, 3 rows, everything
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_value_and_gradient_match_cross_entropy(monkeypatch, chunk_elements, smoothing):
    monkeypatch.setattr(mtkit.training.loss, "CHUNK_ELEMENTS", chunk_elements)
    generator = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(3, 7, 11, generator=generator)
    target = torch.randint(4, 11, (3, 7), generator=generator)
    target[1, 4:] = PAD_ID
    target[2, 1:] = PAD_ID
    expected, expected_grad = value_and_grad(reference, logits, target, smoothing)
    found, found_grad = value_and_grad(sequence_loss, logits, target, smoothing)
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(found_grad, expected_grad, rtol=1e-5, atol=1e-6)
    assert found_grad[1, 4:].abs().sum() == 0 and found_grad[2, 1:].abs().sum() == 0  # pads get no gradient


def test_large_logits_stay_finite():
    logits = torch.tensor([[[1000.0, -1000.0, 0.0, 999.0]]])
    target = torch.tensor([[3]])
    found, grad = value_and_grad(sequence_loss, logits, target, 0.1)
    expected, expected_grad = value_and_grad(reference, logits, target, 0.1)
    assert torch.isfinite(found) and torch.isfinite(grad).all()
    torch.testing.assert_close(found, expected)
    # exp(x - logsumexp) at |x| ~ 1000: fp32 spacing there is 6e-5, so relative 1e-4 is the precision.
    torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-6)


def test_all_padding_gives_zero_loss_and_gradient():
    logits = torch.randn(2, 3, 5)
    target = torch.full((2, 3), PAD_ID)
    found, grad = value_and_grad(sequence_loss, logits, target, 0.1)
    assert found.item() == 0.0 and grad.abs().sum().item() == 0.0
