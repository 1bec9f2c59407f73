"""Low-rank adapters (LoRA, Hu et al. 2021) on a Transformer's projections and embeddings (`train.lora`).

An adapted layer keeps its frozen weight as its own parameter, under the name it had (`qkv.weight`), so a parent's
state dict loads into an adapted model unchanged; it adds `scaling * B A x` (scaling = alpha / rank), with A and B
its only trained parameters (`lora_A`, `lora_B`). B starts at zero (an embedding's A), as in peft, so training
starts from the parent itself. A fused projection (self-attention's `qkv`, cross-attention's `key_value`) holds one
adapter per projection it fuses, as peft does on transformers' separate q_proj, k_proj and v_proj: A stacks theirs by
rows, and so does B.
An adapted embedding table adds a low-rank table (`lora_A` rows by id, V x r, times `lora_B`, r x D), and the output
layer tied to it uses the same two matrices, so that the adapted model is the parent plus one delta per weight and
`merge_lora` gives it exactly. Which layers: `train.lora.targets`, by mtkit's own module names (config.LORA_TARGETS).
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtkit.config import LoraConfig, TrainConfig
from mtkit.errors import MtkitError
from mtkit.models.layers import Dropout, ScaledEmbedding
from mtkit.runtime import autocast_dtype

FUSED_PARTS = {"qkv": 3, "key_value": 2}  # the projections one nn.Linear holds, in the order its output is chunked
ADAPTER_NAMES = ("lora_A", "lora_B")  # the trained parameters' own names; a checkpoint holds these alone


class LoraLinear(nn.Module):
    """An `nn.Linear`'s frozen weight and bias plus `parts` low-rank adapters, one per projection it fuses.

    lora_A (parts * rank, in), lora_B (out, rank): projection p's delta is B[p] @ A[p], B[p] the p-th block of
    out / parts rows and A[p] the p-th block of rank rows. Dropout acts on the adapters' input only.
    """

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float, dropout: float, parts: int = 1) -> None:
        super().__init__()
        self.weight, self.bias = base.weight, base.bias  # the frozen parameters themselves: their names are kept
        self.parts, self.rank, self.scaling = parts, rank, alpha / rank
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(parts * rank, base.in_features, device=device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=device))
        for block in self.lora_A.data.chunk(parts):
            nn.init.kaiming_uniform_(block, a=math.sqrt(5))  # peft's (and nn.Linear's) initialisation of A
        self.dropout = Dropout(dropout)

    @classmethod
    def tied(cls, base: nn.Linear, embedding: LoraEmbedding) -> LoraLinear:
        """The output layer whose weight is `embedding`'s table: its delta is the table's, so the two stay one weight."""
        layer = cls(base, rank=embedding.rank, alpha=embedding.rank * embedding.scaling, dropout=0.0)
        layer.lora_A, layer.lora_B = embedding.lora_B, embedding.lora_A  # (r, D) and (V, r): delta A_emb B_emb, V x D
        return layer

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out)."""
        return F.linear(x, self.weight, self.bias) + self.adapter(x)

    def adapter(self, x: Tensor) -> Tensor:
        """The adapters' part of the output: (..., in) -> (..., out)."""
        hidden = F.linear(self.dropout(x), self.lora_A)  # (..., parts * r)
        if self.parts == 1:
            return F.linear(hidden, self.lora_B) * self.scaling
        hidden = hidden.unflatten(-1, (self.parts, self.rank))  # (..., P, r)
        blocks = self.lora_B.unflatten(0, (self.parts, -1))  # (P, out / P, r)
        return torch.einsum("...pr,por->...po", hidden, blocks).flatten(-2) * self.scaling  # (..., out)

    def delta(self) -> Tensor:
        """The weight the adapters add, (out, in)."""
        blocks = zip(self.lora_B.chunk(self.parts), self.lora_A.chunk(self.parts), strict=True)
        return torch.cat([b.float() @ a.float() for b, a in blocks]) * self.scaling


class LoraEmbedding(nn.Module):
    """An `nn.Embedding`'s frozen table plus a low-rank one: row i gains lora_A[i] @ lora_B * scaling.

    lora_A (V, rank) starts at zero (peft's embedding A, transposed: rows by id, as the table's); lora_B (rank, D)
    normal. No dropout: an id's row is not an input to drop (peft drops none either).
    """

    def __init__(self, base: nn.Embedding, *, rank: int, alpha: float) -> None:
        super().__init__()
        self.weight, self.padding_idx = base.weight, base.padding_idx
        self.rank, self.scaling = rank, alpha / rank
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.zeros(base.num_embeddings, rank, device=device))
        self.lora_B = nn.Parameter(torch.randn(rank, base.embedding_dim, device=device))

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, T) -> (B, T, D)."""
        rows = F.embedding(tokens, self.weight, self.padding_idx)
        return rows + F.embedding(tokens, self.lora_A) @ self.lora_B * self.scaling

    def delta(self) -> Tensor:
        """The table the adapters add, (V, D)."""
        return self.lora_A.float() @ self.lora_B.float() * self.scaling


def apply_lora(model: nn.Module, lora: LoraConfig, *, bf16_base: bool = False) -> int:
    """Freeze every weight of `model` and adapt the layers `lora.targets` names, in place; the parameters trained.
    `bf16_base`: the frozen weight matrices held in bf16 (`hold_base_in_bf16`); a state dict loaded later is cast."""
    model.requires_grad_(False)
    adapted: dict[int, LoraEmbedding] = {}  # by the table they adapt
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(parent, ScaledEmbedding) and "embedding" in lora.targets and isinstance(child, nn.Embedding):
                setattr(parent, name, LoraEmbedding(child, rank=lora.rank, alpha=lora.alpha))
                adapted[id(child.weight)] = getattr(parent, name)
            elif type(child) is nn.Linear and name in lora.targets and parent is not model:
                parts = FUSED_PARTS.get(name, 1)
                setattr(parent, name, LoraLinear(child, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, parts=parts))
    output = getattr(model, "output", None)
    if isinstance(output, nn.Linear) and id(output.weight) in adapted:  # tied to an adapted table
        model.output = LoraLinear.tied(output, adapted[id(output.weight)])
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if bf16_base:
        hold_base_in_bf16(model)
    if not trained:
        raise MtkitError(f"train.lora.targets {', '.join(lora.targets)}: the model has none of these layers")
    return trained


def adapter_weights(model: nn.Module) -> dict[str, Tensor]:
    """The adapters of an adapted model by name (each shared one once): what a LoRA run's checkpoint holds."""
    return {name: p.detach() for name, p in model.named_parameters() if name.rpartition(".")[2] in ADAPTER_NAMES}


def load_adapters(model: nn.Module, weights: dict[str, Tensor], *, mismatch: str) -> None:
    """Copy `weights` into the adapters of `model`; one line (`mismatch` and the first difference) unless they fit."""
    expected = adapter_weights(model)
    missing = next((name for name in expected if name not in weights), None)
    unexpected = next((name for name in weights if name not in expected), None)
    if missing or unexpected:
        raise MtkitError(f"{mismatch}: " + (f"it lacks {missing}" if missing else f"it has {unexpected}, which no adapter has"))
    wrong = next((name for name, t in expected.items() if t.shape != weights[name].shape), None)
    if wrong is not None:
        raise MtkitError(f"{mismatch}: {wrong} has shape {list(weights[wrong].shape)}, the adapter {list(expected[wrong].shape)}")
    with torch.no_grad():
        for name, tensor in expected.items():
            tensor.copy_(weights[name])


def load_base_weights(model: nn.Module, weights: dict[str, Tensor]) -> None:
    """Load a parent's state dict into `model`, adapted or not: strict, but for the adapters, which it cannot hold.
    Raises RuntimeError (torch's) when they do not fit."""
    result = model.load_state_dict(weights, strict=False)
    missing = [name for name in result.missing_keys if name.rpartition(".")[2] not in ADAPTER_NAMES]
    if missing or result.unexpected_keys:
        lacks = f"lacks {missing[0]}" if missing else f"has {result.unexpected_keys[0]}, which the model has not"
        raise RuntimeError(f"the state dict {lacks} ({len(missing)} missing, {len(result.unexpected_keys)} unexpected)")


def bf16_base_on(config: TrainConfig, *, device: torch.device) -> bool:
    """`train.lora.bf16_base`: auto is on where the step runs under bf16 autocast on CUDA, and only there (a bf16
    weight meets fp32 activations elsewhere); true where that is not so is one line."""
    lora = config.lora
    if lora is None or lora.bf16_base == "false":
        return False
    possible = autocast_dtype(device, config.precision) == torch.bfloat16
    if lora.bf16_base == "true" and not possible:
        raise MtkitError(f"train.lora.bf16_base=true on {device.type}: it needs CUDA with bf16; set it to auto or false")
    return possible


def hold_base_in_bf16(model: nn.Module) -> None:
    """The frozen weight matrices in bf16 (`train.lora.bf16_base`): half their memory, under bf16 autocast, where
    they are cast to bf16 anyway; the adapters, norms and biases stay fp32."""
    for parameter in model.parameters():
        if not parameter.requires_grad and parameter.dim() >= 2:
            parameter.data = parameter.data.to(torch.bfloat16)


def merge_lora(model: nn.Module) -> int:
    """Fold every adapter into its weight, in place: each adapted layer becomes the plain `nn.Linear` or
    `nn.Embedding` it was, with weight + delta (a tied output layer keeps the merged table); the layers merged."""
    merged: dict[int, nn.Parameter] = {}  # the merged tables, by the frozen table they replace
    layers = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()]
    for parent, name, child in layers:
        if isinstance(child, LoraEmbedding):
            table = merged.setdefault(id(child.weight), nn.Parameter(child.weight.float() + child.delta(), requires_grad=False))
            plain = nn.Embedding(*table.shape, padding_idx=child.padding_idx, device="meta")
            plain.weight = table
            setattr(parent, name, plain)
    for parent, name, child in layers:
        if isinstance(child, LoraLinear):
            weight = merged.get(id(child.weight))  # a tied output layer: the table merged above
            if weight is None:
                weight = nn.Parameter(child.weight.float() + child.delta(), requires_grad=False)
            plain = nn.Linear(weight.size(1), weight.size(0), bias=child.bias is not None, device="meta")
            plain.weight, plain.bias = weight, child.bias
            setattr(parent, name, plain)
    return sum(isinstance(child, (LoraLinear, LoraEmbedding)) for _, _, child in layers)


def weights_digest(weights: dict[str, Tensor]) -> str:
    """SHA-256 of a state dict (names, dtypes, shapes and bytes, in name order): what a LoRA run records of its
    parent, so that adapters are never applied to other weights than those they were trained on."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()
