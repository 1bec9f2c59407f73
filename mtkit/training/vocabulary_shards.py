"""The vocabulary's rows shared among the processes of `train.shard: fsdp`, never gathered whole.

FSDP gathers a unit's whole weights for its forward and backward and holds their whole gradient until it is
reduced. For the embeddings and the output layer that is the largest thing in each process (NLLB's tied table of
256,206 rows, used three times an update, each use's gradient as large), so here each
process keeps only its rows of each table, a DTensor sharded by rows as FSDP shards a weight (checkpoints, the
optimiser and the clipping see it as they see FSDP's), and the tokens travel instead, as Megatron's
vocabulary-parallel layers do:

- a lookup (`ShardedRowsEmbedding`) gathers every process's token ids, looks up those in its rows, and the sum
  over the processes gives each its own tokens' vectors; backward gathers those vectors' gradients and adds its
  rows' share into its rows' gradient;
- the output layer and the loss (`ShardedTeacherForcing`) gather every process's final states and targets, take
  the logits of its rows for all of them chunk by chunk, and combine each token's log-normaliser, logit sum and
  target logit over the processes; backward recomputes each chunk's logits, adds its rows' gradient, and the sum
  over the processes of the final states' gradients gives each process its own.

Gradients are added in place into the rows' gradient, divided by the number of processes as FSDP divides the
others' (DDP's mean): a tied table's three uses take no more memory than its shard of the gradient. The loss and
gradients are `TeacherForcing`'s (`mtkit.training.loss`); only the order of the sums differs. Every function here
is collective: each process calls it in the same order, as the autograd graph is the same in each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from mtkit.data.tokenizer import PAD_ID
from mtkit.models.base import EncoderDecoder
from mtkit.training.fused_loss import teacher_forced_states

CHUNK_ELEMENTS = 1 << 24  # logits of one chunk of the output layer's rows (64 MB of fp32)
# all_gather_into_tensor under the name torch 2.13 gives it (the old one deprecated there); older torch has the old
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True, kw_only=True)
class Rows:
    """This process's rows [start, stop) of a table of `total` rows split over `group` as DTensor's Shard(0) splits
    it (torch.chunk's sizes: the last processes may have fewer)."""

    start: int
    stop: int
    total: int
    group: Any  # a torch.distributed ProcessGroup

    @classmethod
    def of(cls, total: int, group: Any) -> Rows:
        step = -(-total // dist.get_world_size(group))
        start = min(dist.get_rank(group) * step, total)
        return cls(start=start, stop=min(start + step, total), total=total, group=group)

    def local(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Of ids (N,): which are among these rows (N,) bool, and each one's row among them (N,)."""
        return (ids >= self.start) & (ids < self.stop), ids - self.start


def gather_rows(x: Tensor, group: Any) -> tuple[Tensor, list[int]]:
    """Every process's `x` (n_p, ...) one after another in rank order (sum of n_p, ...), and each process's n_p."""
    size = dist.get_world_size(group)
    counts = torch.empty(size, dtype=torch.long, device=x.device)
    _all_gather(counts, torch.tensor([x.size(0)], device=x.device), group=group)
    sizes = counts.tolist()
    longest = max(sizes)
    padded = x if x.size(0) == longest else torch.cat([x, x.new_zeros((longest - x.size(0), *x.shape[1:]))])
    every = x.new_empty((size * longest, *x.shape[1:]))
    _all_gather(every, padded.contiguous(), group=group)
    if min(sizes) < longest:
        every = torch.cat([every[p * longest : p * longest + n] for p, n in enumerate(sizes)])
    return every, sizes


def own_part(sizes: list[int], group: Any) -> slice:
    """Where this process's rows are among `gather_rows`'s."""
    start = sum(sizes[: dist.get_rank(group)])
    return slice(start, start + sizes[dist.get_rank(group)])


def rows_gradient(weight: nn.Parameter) -> Tensor:
    """This process's rows of `weight`'s gradient (a DTensor like `weight`, zeros if it had none), to add to in place."""
    from torch.distributed.tensor import DTensor

    if weight.grad is None:
        local = torch.zeros_like(weight.to_local())
        weight.grad = DTensor.from_local(local, weight.device_mesh, weight.placements, shape=weight.shape, stride=weight.stride())
    return weight.grad.to_local()


def shard_rows(weight: nn.Parameter, mesh: Any) -> nn.Parameter:
    """`weight` (V, D), which every process holds whole, as a parameter holding this process's rows (a copy: the
    whole table can be freed)."""
    from torch.distributed.tensor import DTensor, Shard

    rows = Rows.of(weight.size(0), mesh.get_group())
    local = weight.detach()[rows.start : rows.stop].clone()
    sharded = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=weight.shape, stride=weight.stride())
    return nn.Parameter(sharded, requires_grad=weight.requires_grad)


class ShardedRowsEmbedding(nn.Module):
    """An `nn.Embedding` whose `weight` is sharded by rows (`shard_rows`): the same lookup, the same gradient
    (none for `padding_idx`'s row), the same name in the state dict."""

    def __init__(self, weight: nn.Parameter, *, padding_idx: int | None, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.weight, self.padding_idx, self.dtype = weight, padding_idx, dtype
        self.rows = Rows.of(weight.size(0), weight.device_mesh.get_group())

    def forward(self, ids: Tensor) -> Tensor:
        """ids (...) -> vectors (..., D), in `dtype` (FSDP's compute dtype) or the weight's."""
        found = _Lookup.apply(ids.reshape(-1), self.weight, self.rows, self.padding_idx)
        return found.view(*ids.shape, -1).to(self.dtype or found.dtype)


class _Lookup(torch.autograd.Function):
    """The vectors of this process's ids (n,) from every process's rows of the sharded weight; gradient into its rows."""

    @staticmethod
    def forward(ctx, ids: Tensor, weight: nn.Parameter, rows: Rows, padding_idx: int | None) -> Tensor:  # type: ignore[override]
        local = weight.to_local()  # (V_p, D)
        every, sizes = gather_rows(ids, rows.group)  # (N,)
        own, index = rows.local(every)
        found = local.new_zeros((every.size(0), local.size(1)))  # (N, D)
        found[own] = local[index[own]]
        dist.all_reduce(found, group=rows.group)  # each token's vector, from the process holding its row
        ctx.save_for_backward(every)
        ctx.weight, ctx.rows, ctx.padding_idx = weight, rows, padding_idx
        return found[own_part(sizes, rows.group)]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[None, ...]:  # type: ignore[override]
        (every,) = ctx.saved_tensors
        rows, weight = ctx.rows, ctx.weight
        grads, _ = gather_rows(grad.contiguous(), rows.group)  # (N, D): every process's tokens'
        if weight.requires_grad:
            own, index = rows.local(every)
            if ctx.padding_idx is not None:
                own &= every != ctx.padding_idx
            rows_grad = rows_gradient(weight)
            rows_grad.index_add_(0, index[own], grads[own].to(rows_grad.dtype), alpha=1.0 / dist.get_world_size(rows.group))
        return None, None, None, None


class ShardedTeacherForcing(nn.Module):
    """`TeacherForcing`'s summed label-smoothed loss of a batch, with the model's output layer sharded by rows
    (`shard_rows`; its bias, if any, whole): the final states under autocast to `amp_dtype`, then `_OutputLoss`."""

    def __init__(self, model: EncoderDecoder, label_smoothing: float, *, amp_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.model, self.label_smoothing, self.amp_dtype = model, label_smoothing, amp_dtype
        weight = model.output.weight
        self.rows = Rows.of(weight.size(0), weight.device_mesh.get_group())

    def forward(
        self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, tgt_out: Tensor, *, src_padded: bool | None = None
    ) -> Tensor:
        hidden = teacher_forced_states(
            self.model, src, src_mask=src_mask, tgt_in=tgt_in, src_padded=src_padded, amp_dtype=self.amp_dtype
        )
        output, flat = self.model.output, hidden.reshape(-1, hidden.size(-1))
        dtype = self.amp_dtype or torch.promote_types(hidden.dtype, output.weight.dtype)
        settings = {"rows": self.rows, "smoothing": self.label_smoothing, "dtype": dtype}
        return _OutputLoss.apply(flat, output.weight, output.bias, tgt_out.reshape(-1), settings)


def _chunks(tokens: int, rows: int) -> list[slice]:
    """Token slices whose logits over `rows` rows take about CHUNK_ELEMENTS."""
    step = max(1, CHUNK_ELEMENTS // max(1, rows))
    return [slice(start, start + step) for start in range(0, tokens, step)]


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """hidden (C, D), weight (V_p, D), bias (V_p,) in the compute dtype -> fp32 logits (C, V_p)."""
    product = hidden @ weight.t() if bias is None else torch.addmm(bias, hidden, weight.t())
    return product.float()


class _OutputLoss(torch.autograd.Function):
    """The summed loss of this process's tokens (`mtkit.training.loss`'s formula) from the logits of every process's
    rows: hidden (n, D), the sharded weight, the whole bias (V,) or None, target (n,)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: nn.Parameter, bias: Tensor | None, target: Tensor, settings: dict) -> Tensor:  # type: ignore[override]
        rows, smoothing, dtype = settings["rows"], settings["smoothing"], settings["dtype"]
        with torch.autocast(hidden.device.type, enabled=False):  # the dtypes are chosen here
            every, sizes = gather_rows(hidden, rows.group)  # (N, D)
            targets, _ = gather_rows(target, rows.group)  # (N,)
            weight_c, bias_c = weight.to_local().to(dtype), None if bias is None else bias[rows.start : rows.stop].to(dtype)
            own, index = rows.local(targets)
            index = index.where(own, 0)
            parts = every.new_zeros((3, every.size(0)), dtype=torch.float32)  # log-normaliser, logit sum, target logit
            for chunk in _chunks(every.size(0), weight_c.size(0)):
                logits = _logits(every[chunk].to(dtype), weight_c, bias_c)  # (C, V_p)
                parts[0, chunk], parts[1, chunk] = torch.logsumexp(logits, dim=-1), logits.sum(-1)
                parts[2, chunk] = logits.gather(1, index[chunk].unsqueeze(1)).squeeze(1) * own[chunk]
            normalisers, _ = gather_rows(parts[:1].contiguous(), rows.group)  # (P, N): each process's rows'
            dist.all_reduce(parts, group=rows.group)
            normaliser = torch.logsumexp(normalisers, dim=0)  # (N,)
            per_token = normaliser - (1.0 - smoothing) * parts[2] - (smoothing / rows.total) * parts[1]
            loss = (per_token * targets.ne(PAD_ID))[own_part(sizes, rows.group)].sum()
        ctx.save_for_backward(every, targets, normaliser, *([] if bias_c is None else [bias_c.clone()]))
        ctx.weight, ctx.settings, ctx.sizes = weight, settings, sizes
        ctx.bias_shape, ctx.bias_dtype = (None, None) if bias is None else (bias.shape, bias.dtype)
        ctx.hidden_dtype = hidden.dtype
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        every, targets, normaliser, *bias_rows = ctx.saved_tensors
        weight, rows, smoothing, dtype = ctx.weight, ctx.settings["rows"], ctx.settings["smoothing"], ctx.settings["dtype"]
        wants_hidden, _, wants_bias = ctx.needs_input_grad[:3]
        with torch.autocast(every.device.type, enabled=False):
            row_weight = _token_weights(grad_output, targets, ctx.sizes, rows.group)  # (N,)
            own, index = rows.local(targets)
            weight_c = weight.to_local().to(dtype)
            bias_c = bias_rows[0] if bias_rows else None
            grad_hidden = every.new_zeros(every.shape, dtype=torch.float32)  # (N, D)
            grad_weight = rows_gradient(weight) if weight.requires_grad else None
            grad_bias = every.new_zeros(ctx.bias_shape, dtype=torch.float32) if wants_bias else None
            for chunk in _chunks(every.size(0), weight_c.size(0)):
                hidden_c = every[chunk].to(dtype)
                grad = _logits(hidden_c, weight_c, bias_c).sub_(normaliser[chunk].unsqueeze(1)).exp_()  # softmax (C, V_p)
                grad.sub_(smoothing / rows.total).mul_(row_weight[chunk].unsqueeze(1))
                chunk_own = own[chunk].nonzero().squeeze(1)
                grad[chunk_own, index[chunk][chunk_own]] -= (1.0 - smoothing) * row_weight[chunk][chunk_own]
                grad_c = grad.to(dtype)
                grad_hidden[chunk] = grad_c @ weight_c
                if grad_weight is not None:
                    _add_product(grad_weight, grad_c.t(), hidden_c, scale=1.0 / dist.get_world_size(rows.group))
                if grad_bias is not None:
                    grad_bias[rows.start : rows.stop] += grad.sum(0)
            dist.all_reduce(grad_hidden, group=rows.group)  # each token's, summed over every process's rows
        grad_mine = grad_hidden[own_part(ctx.sizes, rows.group)].to(ctx.hidden_dtype) if wants_hidden else None
        return grad_mine, None, None if grad_bias is None else grad_bias.to(ctx.bias_dtype), None, None


def _add_product(total: Tensor, left: Tensor, right: Tensor, *, scale: float) -> None:
    """total += scale * left @ right, in place where the dtypes allow (no (V_p, D) temporary)."""
    if left.dtype == total.dtype:
        total.addmm_(left, right, alpha=scale)
    else:
        total.add_(left @ right, alpha=scale)


def _token_weights(grad_output: Tensor, targets: Tensor, sizes: list[int], group: Any) -> Tensor:
    """Each token's weight in the gradient (N,): its process's incoming gradient, 0 for a pad."""
    scales, _ = gather_rows(grad_output.reshape(1).float(), group)  # (P,)
    owners = torch.repeat_interleave(scales, torch.tensor(sizes, device=scales.device))  # (N,)
    return owners * targets.ne(PAD_ID)


def shard_vocabulary(model: EncoderDecoder, mesh: Any, *, dtype: torch.dtype | None) -> set[nn.Parameter]:
    """Shard the rows of `model`'s embeddings and output weight (`model.vocabulary_rows()`; a tied table stays one
    parameter), its embeddings now `ShardedRowsEmbedding`s computing in `dtype`; the sharded parameters, which FSDP
    is to leave alone. The output layer is not called: `ShardedTeacherForcing` takes its weight."""
    sharded: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}  # the whole table's id: it, and its rows
    for name in model.vocabulary_rows():
        owner_name, _, kind = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        if kind != "weight" or isinstance(owner, ShardedRowsEmbedding):  # a bias stays whole; a shared table is done
            continue
        weight = owner.weight
        if id(weight) not in sharded:
            sharded[id(weight)] = (weight, shard_rows(weight, mesh))
        new = sharded[id(weight)][1]
        if isinstance(owner, nn.Embedding):
            parent_name, _, child = owner_name.rpartition(".")
            setattr(
                model.get_submodule(parent_name), child, ShardedRowsEmbedding(new, padding_idx=owner.padding_idx, dtype=dtype)
            )
        else:
            owner.weight = new
    return {new for _, new in sharded.values()}
