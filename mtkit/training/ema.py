"""Exponential moving average of a model's weights (`train.ema`), written as `ema.pt` next to the
run's other checkpoints and decoded like any of them.

The decay warms up as min(decay, (1 + n) / (10 + n)) after n updates, so the average is not
dominated by the random initial weights in short runs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class WeightEMA:
    """A shadow copy of `model`'s parameters, moved towards them after every optimiser update."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.model = model
        self.decay = decay
        self.updates = 0
        # parameters() lists tied weights once; the shadow is keyed by the parameter object. The shadow is
        # fp32 also for bf16 weights (train.bf16_weights), where a 0.999 step would round away.
        self.pairs = [(p, p.detach().float().clone()) for p in model.parameters()]
        self.shadow_of = {id(p): shadow for p, shadow in self.pairs}

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        """shadow <- decay * shadow + (1 - decay) * weights."""
        self.updates += 1
        weight = 1.0 - self.current_decay()
        for param, shadow in self.pairs:
            shadow.lerp_(param.detach().float(), weight)

    def weights(self) -> dict[str, Tensor]:
        """The model's state dict with every parameter replaced by its average (buffers as they are)."""
        state = self.model.state_dict(keep_vars=True)
        return {name: self.shadow_of.get(id(value), value).detach() for name, value in state.items()}

    def state_dict(self) -> dict[str, object]:
        return {"weights": self.weights(), "updates": self.updates}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, object]) -> None:
        weights = state["weights"]
        assert isinstance(weights, dict)
        for name, value in self.model.state_dict(keep_vars=True).items():
            if id(value) in self.shadow_of:
                self.shadow_of[id(value)].copy_(weights[name])
        self.updates = int(state["updates"])  # type: ignore[arg-type]
