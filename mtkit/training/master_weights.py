"""bf16 weights with fp32 master weights (`train.bf16_weights`): the model holds its parameters in
bf16, so a bf16-autocast forward casts no weight, while the optimiser updates fp32 copies.

`MasterWeightOptimizer` wraps the optimiser built over the fp32 copies. Its `step` casts each bf16
gradient to its master once, steps, and copies the masters back into the bf16 parameters (one copy
per update). Checkpoints hold the fp32 masters (`full_precision_weights`, and the wrapper's
`state_dict`), so a resumed run is exact and a saved model loads as fp32 for decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from mtkit.config import TrainConfig
from mtkit.errors import MtkitError


def bf16_weights_on(config: TrainConfig) -> bool:
    """`auto` is off until GPU measurements choose otherwise (docs/performance.md); fp16 keeps fp32 weights."""
    if config.bf16_weights == "true" and config.precision == "fp16":
        raise MtkitError("train.bf16_weights=true with train.precision=fp16: bf16 weights need precision bf16 (or fp32)")
    return config.bf16_weights == "true"


def weights_dtype(config: TrainConfig) -> torch.dtype:
    """The dtype the trained model holds its weights (and float buffers, such as positions) in."""
    return torch.bfloat16 if bf16_weights_on(config) else torch.float32


class MasterWeightOptimizer:
    """An optimiser over fp32 master copies of `model`'s parameters (bf16: `weights_dtype`).

    `build` makes the inner optimiser from the masters (give the learning-rate schedule `.optimizer`).
    `step`, `zero_grad`, `state_dict` and `load_state_dict` behave as the inner optimiser's, so the
    training loop (and a disabled GradScaler) drive it unchanged.
    """

    def __init__(self, model: nn.Module, build: Callable[[Iterable[Tensor]], torch.optim.Optimizer]) -> None:
        self.model = model
        self.parameters = list(model.parameters())  # tied weights once, as the masters
        self.masters = [p.detach().float().clone().requires_grad_(p.requires_grad) for p in self.parameters]
        self.master_of = {id(p): master for p, master in zip(self.parameters, self.masters, strict=True)}
        self.optimizer = build(self.masters)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @torch.no_grad()
    def step(self) -> None:
        """1. each bf16 gradient to its fp32 master; 2. the inner step; 3. the masters back to the model."""
        for parameter, master in zip(self.parameters, self.masters, strict=True):
            master.grad = None if parameter.grad is None else parameter.grad.float()
        found_inf = getattr(self, "found_inf", None)  # set by UpdateGuard for the fused kernel's skip on the device
        if found_inf is not None:
            self.optimizer.found_inf = found_inf  # type: ignore[attr-defined]
        try:
            self.optimizer.step()
        finally:
            if found_inf is not None:
                del self.optimizer.found_inf  # type: ignore[attr-defined]
        self.copy_to_model()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        torch._foreach_copy_([p.data for p in self.parameters], self.masters)

    @torch.no_grad()
    def take_model_weights(self) -> None:
        """Start the masters from the model's weights as they are now (after fine-tuning loaded a parent)."""
        for parameter, master in zip(self.parameters, self.masters, strict=True):
            master.copy_(parameter)

    def weights(self) -> dict[str, Tensor]:
        """The model's state dict with every parameter replaced by its fp32 master (buffers as fp32)."""
        state = self.model.state_dict(keep_vars=True)
        return {name: self.master_of.get(id(value), value.float() if value.is_floating_point() else value).detach()
                for name, value in state.items()}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "masters": [master.detach().clone() for master in self.masters]}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The inner optimiser's state and the exact fp32 masters, copied into the model."""
        if "masters" not in state:
            raise MtkitError("the checkpoint's optimiser state has no fp32 master weights: resume with train.bf16_weights=false")
        self.optimizer.load_state_dict(state["optimizer"])
        for master, saved in zip(self.masters, state["masters"], strict=True):
            master.copy_(saved)
        self.copy_to_model()


def full_precision_weights(model: nn.Module, optimizer: object) -> dict[str, Tensor]:
    """What a checkpoint saves as the model: the fp32 masters with `MasterWeightOptimizer`, else the model's state dict."""
    return optimizer.weights() if isinstance(optimizer, MasterWeightOptimizer) else model.state_dict()
