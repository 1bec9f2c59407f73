"""The training step's levers: the recipe keys that decide how busy a GPU stays.

Each lever is a recipe key: `train.compile` and `train.prefetch` (`auto`: on with CUDA, off on the
CPU, where the plain eager step is the fastest measured; compile not for a `train.max_time` under
`COMPILE_PAYS_AFTER`, too short to win back the minutes compiling takes, and layer by layer where the
model has repeated layers: on an H200 it compiled much sooner, at about the whole step's speed)
and `train.length_multiple` (1, off, by default: on an H200 its padding cost more than its fewer
shapes gave). The figures are in
docs/performance.md, "Training on a GPU: the levers". None changes what is computed: the same
batches in the same order, the same loss (within rounding), the same resume.
`train.shapes` (0, off, by default; `auto`: AUTO_SHAPES with CUDA) groups the same pairs into
batches of at most K shapes (mtkit.training.buckets): other batches, the same pairs each epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtkit.config import TrainConfig, parse_duration

# Compiling the step takes minutes (its first updates, shapes still new) for more updates/s after it
# (docs/performance.md): a run shorter than this loses time to it
COMPILE_PAYS_AFTER = 30 * 60
# `train.shapes=auto` with CUDA: the buckets chosen stop where one more would not pay for its last batch (14 of
# these for Multi30k-like lengths at 4,096 tokens a batch)
AUTO_SHAPES = 16


@dataclass(frozen=True, kw_only=True)
class Levers:
    """The training step's levers as resolved for one device."""

    compile: bool  # torch.compile the forward pass and the loss together
    length_multiple: int  # batch lengths rounded up to a multiple of this
    prefetch: bool  # the next batch collated and copied before the update's host sync
    shapes: int = 0  # at most this many batch shapes an epoch (length buckets); 0: token-budget batches
    by_layer: bool = False  # with compile: each layer and the loss compiled on their own (mtkit.training.regional)
    graphs: bool = False  # with compile, on CUDA: the compiled step replayed as CUDA graphs

    @classmethod
    def of(cls, config: TrainConfig, device: torch.device, *, layered: bool = True) -> Levers:
        """`auto`: on with CUDA; compile only when no `train.max_time` under COMPILE_PAYS_AFTER limits the run,
        layer by layer where the model can be (`layered`: mtkit.training.regional.can_compile_by_layer), else whole."""
        cuda = device.type == "cuda"
        budget = parse_duration(config.max_time)
        # not with train.shard=fsdp, where a compiled step is not tried
        compile_auto = cuda and config.shard == "none" and (budget is None or budget >= COMPILE_PAYS_AFTER)

        def on(value: str, auto: bool) -> bool:
            return auto if value == "auto" else value == "true"

        shapes = (AUTO_SHAPES if cuda else 0) if config.shapes == "auto" else int(config.shapes)
        compile_on = config.compile == "layers" or on(config.compile, compile_auto)
        return cls(
            compile=compile_on,
            by_layer=config.compile == "layers" or (config.compile == "auto" and compile_on and layered),
            graphs=cuda and config.cuda_graphs == "true",
            length_multiple=config.length_multiple,
            prefetch=on(config.prefetch, cuda),
            shapes=shapes,
        )

    def begin_step(self) -> None:
        """Before each forward pass: with CUDA graphs, the last replay's outputs are consumed, so the graphs may
        reuse their memory."""
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()

    def describe(self) -> str:
        """The start line's words for them."""
        how = (", layer by layer" if self.by_layer else "") + (", replayed as CUDA graphs" if self.graphs else "")
        compiled = f"compiled step{how} (its first updates compile it: minutes)"
        parts = [compiled if self.compile else "eager step"]
        parts += [f"lengths rounded to x{self.length_multiple}"] if self.length_multiple > 1 else []
        parts += [f"at most {self.shapes} batch shapes"] if self.shapes else []
        return ", ".join(parts + (["next batch prepared ahead"] if self.prefetch else []))
