"""Linear layers whose weights are laid out once for oneDNN, for decoding on CPU.

`nn.Linear` on CPU hands its weight to a general matrix multiply that lays it out again at every
call. A decoding step multiplies a few hundred rows at most, and for a large output layer (OPUS-MT:
58,000 pieces x 512) that costs more than the arithmetic, where the same product with the weight
laid out once (`torch.ops.mkldnn._reorder_linear_weight`, what torch.compile's freezing does on
CPU) runs faster (`benchmarks/packed.py`; the figures are in docs/performance.md).

`pack_linears` turns every large `nn.Linear` of a loaded model (65,536 weights or more: the output
layer, and every layer from d_model 256 up) into a `PackedLinear`: the same module,
the same parameters and state dict, plus the laid-out copy of its weight (memory: docs/performance.md).
The copy is used only where it is exact to use it: no autograd, float32 on CPU, and the weight
unchanged since it was packed (a model trained after loading falls back to `F.linear`). torch
builds without oneDNN leave the model as it is. Which weight shapes a loaded model has packed is measured
once per machine (`mtkit.models.fast_paths`): the gain depends on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROWS_HINT = 64  # the rows per product oneDNN lays the weight out for: decoding steps multiply 16-300
SMALLEST = 1 << 16  # a d_model 256 square: smaller weights gain little; larger ones are measured (`fast_paths`)


class PackedLinear(nn.Linear):
    """An `nn.Linear` carrying its weight laid out for oneDNN (`packed`, for weight version `packed_version`)."""

    packed: Tensor
    packed_version: int

    def forward(self, x: Tensor) -> Tensor:
        if (
            torch.is_grad_enabled()
            or x.device.type != "cpu"
            or x.dtype != torch.float32
            or self.weight._version != self.packed_version
            or x.numel() == 0
        ):
            return F.linear(x, self.weight, self.bias)
        return packed_product(x, self.packed, bias=self.bias)


def packed_product(x: Tensor, packed: Tensor, *, bias: Tensor | None) -> Tensor:
    """x (..., in) -> (..., out): the product with a weight laid out by `pack_weight`, rows padded to `row_bucket`."""
    flat = x.reshape(-1, x.size(-1))  # (rows, in)
    rows = flat.size(0)
    padded = row_bucket(rows)
    if padded > rows:  # zero rows below (one op: a decoding step calls this for each of its layers)
        flat = F.pad(flat, (0, 0, 0, padded - rows))
    product = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")  # (padded, out)
    return (product[:rows] if padded > rows else product).view(*x.shape[:-1], product.size(1))


def row_bucket(rows: int) -> int:
    """`rows` rounded up to one of a few sizes: at least 8, and at most 7 rows or an eighth more.

    oneDNN builds and keeps a kernel (its size: docs/performance.md) for every new number of rows, up
    to 1,024 of them; a decoding step's rows change as sentences finish, so without buckets a server would
    keep hundreds of them.
    """
    step = max(8, (1 << (rows.bit_length() - 1)) // 8)
    return -(-rows // step) * step


def pack_weight(weight: Tensor) -> Tensor:
    """`weight` (out, in) laid out once for oneDNN (for `packed_product`); RuntimeError or AttributeError from
    an older or reduced oneDNN build."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)


def packable_linears(model: nn.Module) -> list[nn.Linear]:
    """The plain `nn.Linear` modules of `model` that `pack_linears` may pack: large, float32, on the CPU
    (none when this torch has no oneDNN)."""
    if not torch.backends.mkldnn.is_available():
        return []
    return [
        m
        for m in model.modules()
        if type(m) is nn.Linear and m.weight.dtype == torch.float32 and m.weight.is_cpu and m.weight.numel() >= SMALLEST
    ]


def pack_linears(model: nn.Module, *, where: Callable[[nn.Linear], bool] | None = None) -> int:
    """Make every large float32 CPU `nn.Linear` of `model` (those `where` accepts, if given) a `PackedLinear`;
    returns how many were packed.

    It changes the class of those module objects (never `nn.Linear` itself), so it is for a model
    its caller built and owns: `Translator.load` calls it, with `fast_paths=True`, on the models it
    loaded, through `mtkit.models.fast_paths.pack_where_faster` (the shapes packing runs faster on this
    machine). Nothing changes when this torch has no oneDNN (the model then runs as before).
    """
    linears = [m for m in packable_linears(model) if where is None or where(m)]
    for module in linears:
        try:
            packed = pack_weight(module.weight)
        except (RuntimeError, AttributeError):  # an older or reduced oneDNN build: keep the plain layer
            return linears.index(module)
        module.__class__ = PackedLinear
        module.packed, module.packed_version = packed, module.weight._version
    return len(linears)
