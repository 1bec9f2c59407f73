"""The output layer and the training loss fused: the label-smoothed loss of the decoder's final states
without the (N, V) logits or their (N, V) gradient ever held whole (the `train.fused_loss` lever).

The loss is `mtkit.training.loss.sequence_loss`'s, summed over the rows whose target is not PAD_ID:

    x_i = W h_i + b
    loss_i = logsumexp(x_i) - (1 - eps) * x_i[t_i] - (eps / V) * sum_v x_i[v]
    dloss_i / dx_i = softmax(x_i) - (1 - eps) * onehot(t_i) - eps / V

`LinearCrossEntropy` walks the rows in chunks: each chunk's logits (C, V), its loss, its logit
gradient, and that gradient's share of grad_h (C, D), grad_W (V, D) and grad_b (V,), then the next
chunk reuses the memory. Peak extra memory is one chunk's logits, which `chunks_for` sizes to
about the size of the hidden states (Liger kernel's rule).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from mtkit.config import TrainConfig
from mtkit.data.tokenizer import PAD_ID
from mtkit.models.base import EncoderDecoder
from mtkit.runtime import autocast

MAX_CHUNKS = 32


def fused_loss_on(config: TrainConfig, device: torch.device) -> bool:
    """`train.fused_loss` resolved: `auto` is off on every device, the measured default: the fused
    step was slower than the plain loss over whole logits on a GPU and on the CPU, for less peak
    memory (docs/performance.md, "Each lever on and off"). `true` is the memory lever. `device` is
    kept for a device whose measurements differ."""
    del device
    return config.fused_loss == "true"


def chunks_for(vocab_size: int, dim: int) -> int:
    """Row chunks per batch: about vocab_size / dim, so one chunk's logits take about the memory of
    the hidden states (Liger kernel's rule), at most MAX_CHUNKS (a compiled step unrolls them)."""
    return max(1, min(MAX_CHUNKS, -(-vocab_size // dim)))


def output_layer_loss(
    hidden: Tensor,
    weight: Tensor,
    *,
    bias: Tensor | None,
    target: Tensor,
    label_smoothing: float,
    compute_dtype: torch.dtype | None = None,
    chunks: int = 0,
) -> Tensor:
    """`sequence_loss(hidden @ weight.T + bias, target, label_smoothing)` without the (N, V) logits.

    hidden (..., D) final decoder states; weight (V, D); bias (V,) or None; target (...) ids, PAD_ID
    rows count 0. The products run in `compute_dtype` (the autocast dtype; None: the inputs' promoted
    dtype), the softmax and the loss in fp32 (fp64 for fp64 inputs). The N rows are walked in
    `chunks` chunks of ceil(N / chunks) rows (0: `chunks_for`): a count, not a size in rows, so that
    a step compiled for dynamic shapes walks every batch without compiling again for its number of
    tokens.
    """
    flat_hidden, flat_target = hidden.reshape(-1, hidden.size(-1)), target.reshape(-1)  # (N, D), (N,)
    dtype = compute_dtype or torch.promote_types(hidden.dtype, weight.dtype)
    count = chunks or chunks_for(weight.size(0), weight.size(1))
    return LinearCrossEntropy.apply(flat_hidden, weight, bias, flat_target, label_smoothing, dtype, count)


class LinearCrossEntropy(torch.autograd.Function):
    """The summed label-smoothed loss of logits `hidden @ weight.T + bias`, chunk by chunk.

    The gradients are computed in the forward pass and saved (grad_h (N, D), grad_W (V, D), grad_b
    (V,), fp32), and backward only scales them by its incoming gradient, as Liger kernel's fused
    linear cross entropy does. The other way, saving each row's logsumexp and recomputing the chunk
    logits in backward, holds less between the passes (no fp32 (V, D) grad_W) but multiplies by W
    once more: four (N, D, V) products instead of three, and the output layer is the largest
    product of a translation model's step. Training always calls backward, so nothing computed here
    is wasted. The input gradients are only computed where `needs_input_grad` asks (a frozen output
    weight gets none).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        label_smoothing: float,
        compute_dtype: torch.dtype,
        chunks: int,
    ) -> Tensor:
        wants_hidden, wants_weight, wants_bias = ctx.needs_input_grad[:3]
        accumulate = torch.promote_types(compute_dtype, torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):  # the dtypes are chosen here
            grads = _Gradients(weight, bias, accumulate, (wants_hidden, wants_weight, wants_bias))
            weight_c = weight.to(compute_dtype)
            bias_c = None if bias is None else bias.to(compute_dtype)
            loss = hidden.new_zeros((), dtype=accumulate)
            hidden_chunks, target_chunks = _equal_chunks(hidden, target, chunks)
            for index in range(chunks):
                hidden_c = hidden_chunks[index].to(compute_dtype)  # (C, D)
                logits = hidden_c @ weight_c.t() if bias_c is None else torch.addmm(bias_c, hidden_c, weight_c.t())
                chunk_loss, grad_logits = _loss_and_grad(logits.to(accumulate), target_chunks[index], label_smoothing)
                loss = loss + chunk_loss
                grads.add(hidden_c, weight_c, grad_logits)
        ctx.save_for_backward(*grads.saved(hidden.size(0)))
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        wanted = iter(ctx.saved_tensors)
        found = [next(wanted) if asked else None for asked in ctx.needs_input_grad[:3]]
        scaled = [None if grad is None else (grad * grad_output).to(dtype) for grad, dtype in zip(found, ctx.dtypes, strict=True)]
        return (*scaled, None, None, None, None)


def _equal_chunks(hidden: Tensor, target: Tensor, chunks: int) -> tuple[Tensor, Tensor]:
    """hidden (N, D), target (N,) -> (chunks, C, D), (chunks, C): padded with PAD_ID rows to chunks x C.

    Chunks of one size (not `tensor_split`'s, one row longer for N % chunks of them) keep a compiled
    step from specialising on N % chunks: one graph serves every batch size."""
    size = -(-hidden.size(0) // chunks)  # C = ceil(N / chunks)
    missing = size * chunks - hidden.size(0)
    hidden = F.pad(hidden, (0, 0, 0, missing))  # (chunks * C, D)
    target = F.pad(target, (0, missing), value=PAD_ID)  # (chunks * C,)
    return hidden.view(chunks, size, -1), target.view(chunks, size)


def _loss_and_grad(logits: Tensor, target: Tensor, label_smoothing: float) -> tuple[Tensor, Tensor]:
    """One chunk: logits (C, V) in the accumulation dtype (overwritten) -> summed loss and dloss/dlogits (C, V)."""
    vocab_size = logits.size(1)
    weight = target.ne(PAD_ID).to(logits.dtype)  # (C,) 1 on real tokens
    log_normaliser = torch.logsumexp(logits, dim=-1)  # (C,)
    target_logit = logits.gather(1, target.unsqueeze(1)).squeeze(1)  # (C,)
    per_token = log_normaliser - (1.0 - label_smoothing) * target_logit - (label_smoothing / vocab_size) * logits.sum(-1)
    # 1. softmax from the normaliser; 2. the uniform part of the smoothed target; 3. pads weigh 0;
    # 4. the target's own share, (1 - eps), once per row.
    grad = logits.sub_(log_normaliser.unsqueeze(1)).exp_().sub_(label_smoothing / vocab_size).mul_(weight.unsqueeze(1))
    grad.scatter_add_(1, target.unsqueeze(1), (-(1.0 - label_smoothing) * weight).unsqueeze(1))
    return (per_token * weight).sum(), grad


class _Gradients:
    """The input gradients `LinearCrossEntropy` adds up chunk by chunk, in the accumulation dtype."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype, wanted: tuple[bool, ...]) -> None:
        self.hidden: list[Tensor] | None = [] if wanted[0] else None  # (C, D) per chunk
        self.weight = weight.new_zeros(weight.shape, dtype=dtype) if wanted[1] else None  # (V, D)
        self.bias = bias.new_zeros(bias.shape, dtype=dtype) if bias is not None and wanted[2] else None  # (V,)

    def add(self, hidden_c: Tensor, weight_c: Tensor, grad_logits: Tensor) -> None:
        """hidden_c (C, D) and weight_c (V, D) in the compute dtype; grad_logits (C, V) in the accumulation dtype."""
        grad_c = grad_logits.to(weight_c.dtype)  # the products run in the compute dtype, as autocast's would
        if self.hidden is not None:
            self.hidden.append((grad_c @ weight_c).to(grad_logits.dtype))  # (C, D)
        if self.weight is not None and grad_c.dtype == self.weight.dtype:
            self.weight.addmm_(grad_c.t(), hidden_c)  # (V, D)
        elif self.weight is not None:
            self.weight += grad_c.t() @ hidden_c
        if self.bias is not None:
            self.bias += grad_logits.sum(0)

    def saved(self, rows: int) -> list[Tensor]:
        """The gradients for the N = `rows` real rows (the padding rows' are dropped)."""
        hidden = None if self.hidden is None else torch.cat(self.hidden)[:rows]  # (N, D)
        return [grad for grad in (hidden, self.weight, self.bias) if grad is not None]


def teacher_forced_states(
    model: EncoderDecoder,
    src: Tensor,
    *,
    src_mask: Tensor,
    tgt_in: Tensor,
    src_padded: bool | None,
    amp_dtype: torch.dtype | None,
) -> Tensor:
    """The model's teacher-forced final states (B, T, D), before its output layer, under autocast to `amp_dtype`."""
    with autocast(src.device, amp_dtype):
        memory = model.encode(src, src_mask, src_padded=src_padded)
        return model.final_states(tgt_in, memory, src_mask=src_mask, src_padded=src_padded)


class FusedTeacherForcing(nn.Module):
    """The summed label-smoothed loss of one batch, as `TeacherForcing` computes it, with the output
    layer fused into the loss: the model's teacher-forced final states under autocast to
    `amp_dtype`, then `output_layer_loss` over its output layer's weight and bias."""

    def __init__(self, model: EncoderDecoder, label_smoothing: float, *, amp_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.model, self.label_smoothing, self.amp_dtype = model, label_smoothing, amp_dtype

    def forward(
        self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, tgt_out: Tensor, *, src_padded: bool | None = None
    ) -> Tensor:
        hidden = teacher_forced_states(
            self.model, src, src_mask=src_mask, tgt_in=tgt_in, src_padded=src_padded, amp_dtype=self.amp_dtype
        )
        output = self.model.output
        return output_layer_loss(
            hidden,
            output.weight,
            bias=output.bias,
            target=tgt_out,
            label_smoothing=self.label_smoothing,
            compute_dtype=self.amp_dtype,
        )
