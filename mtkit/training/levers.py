"""The training step's levers: the recipe keys that decide how busy a GPU stays.

Each lever is a recipe key: `train.compile` and `train.prefetch` (`auto`: on with CUDA, off on the
CPU, where the plain eager step is the fastest measured; compile not for a `train.max_time` under
`COMPILE_PAYS_AFTER`, too short to win back the minutes compiling takes) and `train.length_multiple`
(1, off, by default: on an H200 its padding cost more than its fewer shapes gave). The figures are in
docs/performance.md, "Training on a GPU: the levers". None changes what is computed: the same
batches in the same order, the same loss (within rounding), the same resume.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtkit.config import TrainConfig, parse_duration

# Compiling the step takes minutes (its first updates, shapes still new) for more updates/s after it
# (docs/performance.md): a run shorter than this loses time to it
COMPILE_PAYS_AFTER = 30 * 60


@dataclass(frozen=True, kw_only=True)
class Levers:
    """The training step's levers as resolved for one device."""

    compile: bool  # torch.compile the forward pass and the loss together
    length_multiple: int  # batch lengths rounded up to a multiple of this
    prefetch: bool  # the next batch collated and copied before the update's host sync

    @classmethod
    def of(cls, config: TrainConfig, device: torch.device) -> Levers:
        """`auto`: on with CUDA; compile only when no `train.max_time` under COMPILE_PAYS_AFTER limits the run."""
        cuda = device.type == "cuda"
        budget = parse_duration(config.max_time)
        compile_auto = cuda and (budget is None or budget >= COMPILE_PAYS_AFTER)

        def on(value: str, auto: bool) -> bool:
            return auto if value == "auto" else value == "true"

        return cls(
            compile=on(config.compile, compile_auto), length_multiple=config.length_multiple, prefetch=on(config.prefetch, cuda)
        )

    def describe(self) -> str:
        """The start line's words for them."""
        parts = ["compiled step (its first updates compile it: minutes)" if self.compile else "eager step"]
        parts += [f"lengths rounded to x{self.length_multiple}"] if self.length_multiple > 1 else []
        return ", ".join(parts + (["next batch prepared ahead"] if self.prefetch else []))
