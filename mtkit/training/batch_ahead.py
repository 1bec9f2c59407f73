"""The training device's side of the batches: one epoch's groups collated on the device, one group ahead
with the `prefetch` lever (mtkit.training.levers), so the GPU does not wait for the next batch."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mtkit.training.batches import Batch, Epoch
from mtkit.training.levers import Levers


class BatchAhead:
    """One epoch's groups of batches (`accumulate` each) on the training device, with the levers'
    rounded lengths, collated one group ahead with the `prefetch` lever: `prepare` collates the group
    at a position (pinned, copied without blocking) while the GPU still works; `take` returns it, or
    collates it then when it was not prepared."""

    def __init__(self, epoch: Epoch, accumulate: int, *, device: torch.device, levers: Levers) -> None:
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
        return [
            self.epoch.ids.collate(batch, pin_memory=pin, length_multiple=self.levers.length_multiple).to(self.device)
            for batch in indices
        ]
