"""The training loss: label-smoothed cross-entropy over non-pad target tokens.

One autograd function computes it from the logits without a one-hot matrix, without a stored
log-probability matrix and without the zero-filled gradient that `F.cross_entropy`'s NLL backward
allocates. On CPU the (N, V) logits are walked in row chunks that stay in cache (its time against
`F.cross_entropy`'s: docs/performance.md, "The CPU training step").

    loss_i = logsumexp(x_i) - (1 - eps) * x_i[t_i] - (eps / V) * sum_v x_i[v]
    dloss_i / dx_i = softmax(x_i) - (1 - eps) * onehot(t_i) - eps / V

`TeacherForcing` is the module the training step calls: the model's forward pass and this loss as one
module, which torch.compile fuses and DDP wraps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from mtkit.data.tokenizer import PAD_ID
from mtkit.models.base import EncoderDecoder
from mtkit.runtime import autocast

CHUNK_ELEMENTS = 1 << 19  # logits per CPU chunk (2 MB of fp32): several chunks fit in L2


def sequence_loss(logits: Tensor, target: Tensor, *, label_smoothing: float) -> Tensor:
    """Summed label-smoothed cross-entropy of `logits` (..., V) against `target` (...), pads ignored."""
    vocab_size = logits.size(-1)
    return SmoothedCrossEntropy.apply(logits.reshape(-1, vocab_size).float(), target.reshape(-1), label_smoothing)


def _chunks(rows: int, vocab_size: int, device: torch.device) -> list[slice]:
    """Row slices to walk the logits by: cache-sized on CPU, one slice on a GPU."""
    step = max(1, rows if device.type != "cpu" else CHUNK_ELEMENTS // vocab_size)
    return [slice(start, start + step) for start in range(0, rows, step)]


class SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of (N, V) fp32 logits; rows whose target is PAD_ID count 0."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, label_smoothing: float) -> Tensor:  # type: ignore[override]
        rows, vocab_size = logits.shape
        log_normaliser = logits.new_empty(rows)  # logsumexp of each row, (N,)
        row_sum = logits.new_empty(rows)  # (N,)
        for chunk in _chunks(rows, vocab_size, logits.device):
            torch.logsumexp(logits[chunk], dim=-1, out=log_normaliser[chunk])
            torch.sum(logits[chunk], dim=-1, out=row_sum[chunk])
        weight = target.ne(PAD_ID).to(logits.dtype)  # (N,) 1 on real tokens
        target_logit = logits.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
        per_token = log_normaliser - (1.0 - label_smoothing) * target_logit - (label_smoothing / vocab_size) * row_sum
        ctx.save_for_backward(logits, target, log_normaliser, weight)
        ctx.label_smoothing = label_smoothing
        return (per_token * weight).sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        logits, target, log_normaliser, weight = ctx.saved_tensors
        smoothing, (rows, vocab_size) = ctx.label_smoothing, logits.shape
        row_weight = weight * grad_output  # (N,)
        grad = torch.empty_like(logits)  # (N, V)
        for chunk in _chunks(rows, vocab_size, logits.device):
            # 1. softmax from the saved normaliser; 2. the uniform part of the smoothed target; 3. weight.
            part = grad[chunk]
            torch.sub(logits[chunk], log_normaliser[chunk].unsqueeze(1), out=part).exp_()
            part.sub_(smoothing / vocab_size).mul_(row_weight[chunk].unsqueeze(1))
        # 4. the target's own share, (1 - eps), once per row.
        grad.scatter_add_(1, target.unsqueeze(1), (-(1.0 - smoothing) * row_weight).unsqueeze(1))
        return grad, None, None


def fused_sequence_loss(logits: Tensor, target: Tensor, *, label_smoothing: float) -> Tensor:
    """The same loss as `sequence_loss` as `F.cross_entropy` writes it: what a compiled step uses,
    fused by Inductor with the logits' upcast into a few kernels instead of fp32 copies of (N, V)."""
    vocab_size = logits.size(-1)
    flat_logits, flat_target = logits.reshape(-1, vocab_size).float(), target.reshape(-1)
    return F.cross_entropy(flat_logits, flat_target, ignore_index=PAD_ID, label_smoothing=label_smoothing, reduction="sum")


class TeacherForcing(nn.Module):
    """The summed label-smoothed loss of one batch: the model's teacher-forced logits under autocast
    to `amp_dtype`, then the loss in fp32, pads ignored.

    `fused`: the loss is `F.cross_entropy`, written for `torch.compile` to fuse into the output
    layer's few kernels; else the chunked `SmoothedCrossEntropy`, faster eager (above).
    """

    def __init__(self, model: EncoderDecoder, label_smoothing: float, *, amp_dtype: torch.dtype | None, fused: bool) -> None:
        super().__init__()
        self.model, self.label_smoothing, self.amp_dtype, self.fused = model, label_smoothing, amp_dtype, fused
        self.compiled_loss: Callable[..., Tensor] | None = None  # train.compile=layers's

    def forward(
        self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, tgt_out: Tensor, *, src_padded: bool | None = None
    ) -> Tensor:
        with autocast(src.device, self.amp_dtype):
            logits = self.model(src, src_mask, tgt_in, src_padded=src_padded)
        return (self.compiled_loss or self.loss_function())(logits, tgt_out, label_smoothing=self.label_smoothing)

    def loss_function(self) -> Callable[..., Tensor]:
        """The loss of logits against targets: `fused_sequence_loss` for a compiled step, else `sequence_loss`."""
        return fused_sequence_loss if self.fused else sequence_loss
