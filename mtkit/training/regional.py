"""Compiling the training step layer by layer (`train.compile: layers`).

The whole step compiled (`train.compile: true`) makes the compiler trace every layer of the model one
after the other, each a copy of the same code: minutes on a GPU, most of it tracing, which a saved
compiler cache does not skip (docs/performance.md). Compiled by layer, each of the model's repeated
blocks (`EncoderDecoder.repeated_blocks`: a Transformer's encoder and decoder layers) is compiled in
place and the loss on its own, so the compiler traces one encoder layer, one decoder layer and the
loss; the other layers of a kind reuse that code (their weights are inputs, not constants). What is
computed is unchanged: the same operations in the same order, only fused within a layer.

Blocks compiled in place would compile again for validation's decoding (other calls, eval mode), so
the trainer validates under `eager`, which runs compiled code eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from functools import wraps
from typing import ParamSpec, TypeVar

import torch
from torch import nn

from mtkit.errors import MtkitError
from mtkit.models.base import EncoderDecoder
from mtkit.training.loss import TeacherForcing

P = ParamSpec("P")
R = TypeVar("R")


def compile_by_layer(step: nn.Module, model: EncoderDecoder, *, backend: str = "inductor", mode: str | None = None) -> None:
    """Compile each of `model`'s repeated blocks in place, and the loss of `step` (the training forward,
    under DDP or not) on its own where it is `TeacherForcing`'s (the fused output layer's autograd
    function stays eager).

    `backend` and `mode` are torch.compile's: tests use the "aot_eager" backend (the same graphs and
    autograd, no code generation); `train.cuda_graphs` gives the mode "reduce-overhead". A model with
    no repeated blocks, or a torch without `torch.compiler.set_stance` (2.6+), is refused in one line."""
    blocks = model.repeated_blocks()
    if not blocks:
        raise MtkitError(f"train.compile=layers: a {type(model).__name__} model has no repeated layers; give train.compile=true")
    if not hasattr(torch.compiler, "set_stance"):
        raise MtkitError(f"train.compile=layers needs torch 2.6 or newer (this is {torch.__version__}); give train.compile=true")
    for block in blocks:
        block.compile(dynamic=True, backend=backend, mode=mode)
    teacher = getattr(step, "module", step)  # DDP holds the module it wraps as `.module`
    if isinstance(teacher, TeacherForcing):
        teacher.compiled_loss = torch.compile(teacher.loss_function(), dynamic=True, backend=backend, mode=mode)


def can_compile_by_layer(model: EncoderDecoder) -> bool:
    """Whether `compile_by_layer` takes `model` (it has repeated blocks, and torch has `set_stance`): where not,
    `train.compile: auto` compiles the whole step."""
    return bool(model.repeated_blocks()) and hasattr(torch.compiler, "set_stance")


def eager(function: Callable[P, R]) -> Callable[P, R]:
    """`function` run with every compiled module and function in it running eagerly (nothing compiles)."""

    @wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        stance = torch.compiler.set_stance("force_eager") if hasattr(torch.compiler, "set_stance") else nullcontext()
        with stance:
            return function(*args, **kwargs)

    return run
