"""The training step's parts that decide how busy a GPU stays: the levers, the loss module and the batch look-ahead.

Each lever is a recipe key: `train.compile` and `train.prefetch` (`auto`: on with CUDA, off on the
CPU, where the plain eager step is the fastest measured; compile not for a `train.max_time` under
30 minutes) and `train.length_multiple` (1, off, by
default: on an H200 its padding cost more than its fewer shapes gave; docs/performance.md). None
changes what is computed: the same batches in the same order, the same loss (within rounding), the
same resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mtkit.config import TrainConfig, parse_duration
from mtkit.models.base import EncoderDecoder
from mtkit.runtime import autocast
from mtkit.training.batches import Batch, Epoch
from mtkit.training.loss import fused_sequence_loss, sequence_loss

# Compiling the step took 2-4 minutes on an H200 (its first updates, shapes still new) for 1.5x the updates/s
# after it: a run shorter than this loses time to it
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


class TeacherForcing(nn.Module):
    """The summed label-smoothed loss of one batch: the model's teacher-forced logits under autocast
    to `amp_dtype`, then the loss in fp32, pads ignored.

    `fused`: the loss is `F.cross_entropy`, written for `torch.compile` to fuse into the output
    layer's few kernels; else the chunked `SmoothedCrossEntropy`, faster eager (mtkit.training.loss).
    """

    def __init__(self, model: EncoderDecoder, label_smoothing: float, amp_dtype: torch.dtype | None, fused: bool) -> None:
        super().__init__()
        self.model, self.label_smoothing, self.amp_dtype, self.fused = model, label_smoothing, amp_dtype, fused

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> Tensor:
        with autocast(src.device, self.amp_dtype):
            logits = self.model(src, src_mask, tgt_in)
        loss = fused_sequence_loss if self.fused else sequence_loss
        return loss(logits, tgt_out, self.label_smoothing)


class BatchAhead:
    """One epoch's groups of batches (`accumulate` each) on the training device, with the levers'
    rounded lengths, collated one group ahead with the `prefetch` lever: `prepare` collates the group
    at a position (pinned, copied without blocking) while the GPU still works; `take` returns it, or
    collates it then when it was not prepared."""

    def __init__(self, epoch: Epoch, accumulate: int, device: torch.device, levers: Levers) -> None:
        self.epoch, self.accumulate, self.device, self.levers = epoch, accumulate, device, levers
        self._ahead: tuple[int, list[Batch]] | None = None

    def __len__(self) -> int:
        return len(self.epoch.batches)

    def take(self, start: int) -> list[Batch]:
        if self._ahead is not None and self._ahead[0] == start:
            group, self._ahead = self._ahead[1], None
            return group
        return self._collate(start)

    def while_waiting(self, start: int) -> Callable[[], None] | None:
        """What `Trainer.update` does before its host sync: with the `prefetch` lever, prepare the group at `start`."""
        return (lambda: self.prepare(start)) if self.levers.prefetch else None

    def prepare(self, start: int) -> None:
        if start < len(self.epoch.batches):
            self._ahead = (start, self._collate(start))

    def _collate(self, start: int) -> list[Batch]:
        pin = self.device.type == "cuda"
        indices = self.epoch.batches[start : start + self.accumulate]
        return [self.epoch.ids.collate(batch, pin, self.levers.length_multiple).to(self.device) for batch in indices]
