"""Activation checkpointing (`train.checkpoint_activations`): each of the model's repeated blocks
(`EncoderDecoder.repeated_blocks`, a Transformer's layers) keeps only its input in the forward pass and
computes its activations again in the backward pass, so the memory of a step holds one layer's
activations at a time instead of every layer's: for models of hundreds of millions of parameters
(NLLB-600M and up), at the cost of a second forward pass through each layer.

The recomputation replays the random number generator's state, so dropout draws the same masks: the
loss and the gradients are those of the plain step. Outside training (no gradient, or eval mode) a
block runs as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from mtkit.errors import MtkitError
from mtkit.models.base import EncoderDecoder


def recompute_blocks(model: EncoderDecoder) -> int:
    """Make each repeated block of `model` recompute its activations in the backward pass; the number of blocks.
    A model with none is refused in one line."""
    blocks = model.repeated_blocks()
    if not blocks:
        raise MtkitError(f"train.checkpoint_activations: a {type(model).__name__} model has no repeated layers; set it false")
    for block in blocks:
        block.forward = partial(_recomputed, block, block.forward)  # the instance's forward: state-dict names stay
    return len(blocks)


def _recomputed(block: torch.nn.Module, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if block.training and torch.is_grad_enabled():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)
