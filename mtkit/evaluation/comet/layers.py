"""The pieces every COMET model puts over its encoder, computed as unbabel-comet computes them and named as its
checkpoints name their weights: the layer mix (`layerwise_attention`), sentence pooling, the feed-forward
estimator (`estimator.ff.N`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mtkit.errors import MtkitError

# The activations an estimator is built with: torch.nn's element-wise ones that take no arguments and that
# unbabel-comet's spelling (`getattr(nn, name.title())`) finds. Any other torch.nn class it would build, such as
# Transformer (a model of its own) or Threshold (which needs arguments), is refused by name.
ACTIVATIONS: dict[str, type[nn.Module]] = {
    module.__name__: module
    for module in (
        nn.Tanh,
        nn.Sigmoid,
        nn.Softplus,
        nn.Softsign,
        nn.Tanhshrink,
        nn.Hardtanh,
        nn.Hardsigmoid,
        nn.Hardswish,
        nn.Hardshrink,
        nn.Softshrink,
        nn.Mish,
    )
}


def sparsemax(weights: Tensor) -> Tensor:
    """Sparsemax of a vector (Martins & Astudillo 2016): the Euclidean projection onto the simplex, which zeroes
    the smallest weights where softmax would only shrink them."""
    ordered, _ = torch.sort(weights, descending=True)
    cumulative = ordered.cumsum(0) - 1
    ranks = torch.arange(1, weights.numel() + 1, device=weights.device, dtype=weights.dtype)
    support = (ranks * ordered > cumulative).sum()  # how many weights stay above zero
    threshold = cumulative[support - 1] / support.to(weights.dtype)
    return torch.clamp(weights - threshold, min=0)


class LayerwiseAttention(nn.Module):
    """A learned mix of the encoder's layers: gamma * sum_k w_k * layer_k, with w = softmax or sparsemax of one
    scalar per layer; with `layer_norm`, each layer is first normalised over a sentence's unpadded positions."""

    def __init__(self, num_layers: int, *, layer_norm: bool, transformation: str) -> None:
        super().__init__()
        if transformation not in ("softmax", "sparsemax", "sparsemax_patch"):
            raise MtkitError(f"hparams.yaml: layer_transformation {transformation!r}; COMET models use softmax or sparsemax")
        # "sparsemax_patch" marks checkpoints trained while unbabel-comet applied softmax: it still does.
        self.transform = sparsemax if transformation == "sparsemax" else lambda weights: torch.softmax(weights, dim=0)
        self.layer_norm = layer_norm
        self.scalar_parameters = nn.ParameterList([nn.Parameter(torch.zeros(1)) for _ in range(num_layers)])
        self.gamma = nn.Parameter(torch.ones(1))

    def forward(self, layers: tuple[Tensor, ...], mask: Tensor) -> Tensor:
        """layers: num_layers tensors (B, T, H); mask: (B, T), 1 at real tokens. Returns (B, T, H)."""
        weights = self.transform(torch.cat(list(self.scalar_parameters)))
        if self.layer_norm:
            mask = mask.to(layers[0].dtype)
            layers = tuple(_masked_layer_norm(layer, mask) for layer in layers)
        mixed = 0
        for weight, layer in zip(torch.split(weights, 1), layers, strict=True):
            mixed = mixed + weight * layer
        return self.gamma * mixed


def _masked_layer_norm(layer: Tensor, mask: Tensor) -> Tensor:
    """Normalise each sentence's (B, T, H) states by the mean and variance over its real tokens."""
    batch, _, hidden = layer.shape
    broadcast = mask.unsqueeze(-1)
    masked = layer * broadcast
    count = mask.sum(1) * hidden  # (B,)
    mean = (masked.view(batch, -1).sum(1) / count).view(batch, 1, 1)
    variance = (((masked - mean) * broadcast) ** 2).view(batch, -1).sum(1) / count
    return (layer - mean) / torch.sqrt(variance + 1e-12).view(batch, 1, 1)


def pool(embeddings: Tensor, input_ids: Tensor, *, mask: Tensor, how: str, pad_id: int) -> Tensor:
    """(B, T, H) token states to (B, H) sentence embeddings: "avg" over real tokens, "max", or "cls" (the first)."""
    padding = input_ids.eq(pad_id).unsqueeze(-1)  # (B, T, 1)
    if how == "avg":
        summed = embeddings.float().masked_fill(padding, 0.0).type_as(embeddings).sum(1)
        return (summed / mask.unsqueeze(-1).expand(embeddings.size()).float().sum(1)).type_as(embeddings)
    if how == "max":
        return embeddings.float().masked_fill(padding, float("-inf")).type_as(embeddings).max(dim=1)[0]
    if how == "cls":
        return embeddings[:, 0, :]
    raise MtkitError(f"hparams.yaml: pool {how!r}; COMET models pool by avg, max, cls or default")


class FeedForward(nn.Module):
    """The estimator: Linear, activation (and dropout) per hidden size, then a Linear to one score (`ff.N` as saved)."""

    def __init__(self, in_dim: int, hidden_sizes: list[int], *, activation: str, final_activation: str | None) -> None:
        super().__init__()
        modules: list[nn.Module] = []
        for size_in, size_out in zip([in_dim, *hidden_sizes[:-1]], hidden_sizes, strict=True):
            # nn.Identity where training had dropout: scoring never drops, and the Linears keep their saved indices
            modules += [nn.Linear(size_in, size_out), _activation(activation), nn.Identity()]
        modules.append(nn.Linear(hidden_sizes[-1], 1))
        if final_activation is not None:
            modules.append(_activation(final_activation))
        self.ff = nn.Sequential(*modules)

    def forward(self, features: Tensor) -> Tensor:
        """(B, in_dim) -> (B,) scores."""
        return self.ff(features).view(-1)


def _activation(name: str) -> nn.Module:
    """The activation of that name, as unbabel-comet spells it ("Tanh", "sigmoid"); hparams.yaml's names are checked
    against `ACTIVATIONS` when it is read (checkpoint.py)."""
    return ACTIVATIONS[name.title()]()
