"""An optimiser update's device side: clipping, the finite check, Adam, the loss scaler, the schedule and
the EMA, with no host sync.

Reading whether an update's loss and gradient are finite makes the host wait for the GPU at every
update. Instead a non-finite update is skipped on the device: Adam's fused kernel takes the
`found_inf` tensor that the fp16 GradScaler gives it (and under bf16 or fp32 one made here from the
loss and the gradient norm) and leaves the weights, both moments and its step count as they were; the
EMA moves with weight 0. Masking the weights instead (copy_(where(ok, new, old))) would need a copy of
every weight and moment. The host counts each update when it is queued and reads its flag later
(`UpdateGuard.settle`, one update late): a skipped update then gives back its count in the schedule
and the EMA, so the next update's learning rate is the one it would have had.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mtkit.training.ema import WeightEMA
from mtkit.training.progress import Progress


class UpdateGuard:
    """Applies updates that are finite and skips the others, all on the device; the flags wait for `settle`.

    Without Adam's fused kernel (torch 2.3 on the CPU) the optimiser cannot take `found_inf`: there
    the flag is read at once, which on the CPU waits for nothing.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: torch.amp.GradScaler,
        ema: WeightEMA | None,
        clip_norm: float,
    ) -> None:
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler, self.scaler, self.ema = optimizer, scheduler, scaler, ema
        self.clip_norm = clip_norm or float("inf")  # 0: no clipping, the norm is still checked
        self.fused = bool(optimizer.defaults.get("fused"))
        # each queued update's [applied, loss finite] on the host (pinned, filled by a copy the GPU makes after
        # the update) and the event that says the copy is done; None on the CPU, where the flags are host tensors
        self._pending: list[tuple[Tensor, torch.cuda.Event | None]] = []

    def clip_and_check(self, loss_sum: Tensor) -> Tensor:
        """Unscale (fp16) and clip the gradients; True (a bool tensor, on the device) when the loss and gradient are finite."""
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.clip_norm, error_if_nonfinite=False, foreach=True)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor (train.shard=fsdp): the norm over every rank's shards, replicated
            grad_norm = grad_norm.full_tensor()
        return torch.isfinite(loss_sum) & torch.isfinite(grad_norm)

    def step(self, applied: Tensor, loss_sum: Tensor) -> None:
        """Queue the update, a no-op where `applied` is False; the schedule and EMA count it now (`settle` takes it back)."""
        if self.fused:
            self.optimizer.found_inf = (~applied).float()  # type: ignore[attr-defined]  # as GradScaler.step passes it
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf  # type: ignore[attr-defined]
        elif bool(applied):  # no fused kernel: the CPU, where reading the flag waits for nothing
            self.optimizer.step()
        if self.scaler.is_enabled():
            self.scaler.update()  # unscale_ recorded any overflow: the scale is lowered
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(applied)
        self.optimizer.zero_grad(set_to_none=True)
        self._pending.append(self._flags_to_host(torch.stack((applied, torch.isfinite(loss_sum)))))

    def _flags_to_host(self, flags: Tensor) -> tuple[Tensor, torch.cuda.Event | None]:
        if flags.device.type != "cuda":
            return flags, None
        host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
        host.copy_(flags, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done

    def settle(self, progress: Progress) -> list[tuple[int, float]]:
        """Count the outcomes of the updates queued since the last call in `progress`, a skipped one's step given
        back here too; returns the (step before it, loss scale after it) of each fp16 gradient overflow.

        Called after the next update's forward and backward are queued, it waits for the earlier update only.
        """
        overflows = []
        for flags, done in self._pending:
            if done is not None:
                done.synchronize()
            applied, loss_finite = flags.tolist()
            progress.count(applied=applied)
            if not applied:
                self._take_back()
                if loss_finite and self.scaler.is_enabled():  # an overflow (or a NaN): the scaler lowered its scale
                    overflows.append((progress.step, self.scaler.get_scale()))
        self._pending.clear()
        return overflows

    def _take_back(self) -> None:
        """A skipped update leaves the schedule and the EMA's warm-up where they were (its Adam step never ran)."""
        self.scheduler.last_epoch -= 2  # step() adds one back and sets the learning rate of that count
        self.scheduler.step()
        if self.ema is not None:
            self.ema.take_back()
