"""Multi-process training and translation under `torchrun`: process group set-up and the few collectives they need.

Without torchrun (no WORLD_SIZE in the environment, or 1) every function here is a no-op, so the
single-process path pays nothing. The address and port come from torchrun's environment.

Numbers the host holds (a batch's token count, a stop vote, the clock) are reduced as CPU tensors over
a gloo group, never through the GPU: an NCCL collective on them would need a copy to the GPU and back,
each waiting for all the GPU work queued before it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from mtkit.runtime import resolve_device


@dataclass(frozen=True, kw_only=True)
class Distributed:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    host_group: Any = field(default=None, compare=False, repr=False)  # gloo, for host numbers; None: the default group

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> tuple[Distributed, torch.device]:
    """Join the torchrun job if there is one: NCCL on CUDA (one GPU per local rank), gloo on CPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Distributed(), device
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    host_group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
    return Distributed(rank=rank, world_size=world_size, local_rank=local_rank, host_group=host_group), device


def sum_over_ranks(value: torch.Tensor, distributed: Distributed) -> torch.Tensor:
    """The sum of `value` over all ranks (the value itself in a single process)."""
    if distributed.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def tokens_over_ranks(count: int, device: torch.device, *, distributed: Distributed) -> int | torch.Tensor:
    """The sum of a token count over all ranks: in a single process the count; under torchrun a tensor on `device`,
    reduced by the model's own collective, queued like the update's other work (the ranks' hosts do not meet)."""
    if not distributed.enabled:
        return count
    return sum_over_ranks(torch.tensor(count, dtype=torch.int64, device=device), distributed)


class StopAgreement:
    """How the ranks agree to stop at the same update. The limits every rank computes alike (steps, epochs,
    non-finite updates, patience) need no meeting. A clock limit (`train.max_time`) does: the ranks meet on the
    host once an update and take the largest clock, which a time-based schedule reads too. A signal (one rank's
    SIGTERM, say) is a vote sent without waiting and read one update later, so without a clock limit the hosts
    never wait for each other."""

    def __init__(self, distributed: Distributed, *, clocked: bool) -> None:
        self.distributed, self.clocked = distributed, clocked
        self._vote: tuple[Any, torch.Tensor] | None = None  # the last update's vote: (its work, its tensor)

    def stop(self, elapsed: float, *, limit_reached: bool, signalled: bool) -> tuple[bool, float]:
        """Whether every rank stops now, and the clock they agree on (this rank's `elapsed` unless they met on it)."""
        if not self.distributed.enabled:
            return limit_reached or signalled, elapsed
        if self.clocked:
            stop, agreed = max_over_ranks([float(limit_reached or signalled), elapsed], self.distributed)
            return bool(stop), agreed
        return self._voted(signalled) or limit_reached, elapsed

    def _voted(self, signalled: bool) -> bool:
        """Whether any rank was signalled by the last update (its vote read now); sends this update's vote."""
        voted = False
        if self._vote is not None:
            work, tensor = self._vote
            work.wait()
            voted = bool(tensor.item())
        tensor = torch.tensor(int(signalled), dtype=torch.int64)
        self._vote = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.distributed.host_group, async_op=True), tensor
        return voted


def max_over_ranks(values: list[float], distributed: Distributed) -> list[float]:
    """Each value's largest over all ranks, in one collective on the host (no GPU waits); in a single process the values."""
    if not distributed.enabled:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=distributed.host_group)
    return tensor.tolist()


def broadcast_from_main(values: list, distributed: Distributed) -> list:
    """Rank 0's `values` (a list of plain objects) on every rank."""
    if distributed.enabled:
        dist.broadcast_object_list(values, src=0)
    return values


def barrier(distributed: Distributed) -> None:
    if distributed.enabled:
        dist.barrier()


def shutdown(distributed: Distributed) -> None:
    """Leave the job together: no rank tears down its connections while a peer still uses them."""
    if distributed.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


@contextlib.contextmanager
def distributed_translation(device: str) -> Iterator[tuple[Distributed, torch.device]]:
    """Join the torchrun job of `torchrun -m mtkit translate` (if any) and this rank's device (`device`: a name or
    auto, `runtime.resolve_device`); leave it at the end.

    After an error the rank leaves at once without waiting for its peers: torchrun then ends the job.
    """
    distributed, rank_device = init_distributed(resolve_device(device))
    yield distributed, rank_device
    shutdown(distributed)


def gather_in_order(items: list, distributed: Distributed) -> list:
    """On rank 0, every rank's items back in input order, when rank r holds items r, r + N, r + 2N, ...

    Other ranks get an empty list; a single process gets `items` unchanged.
    """
    if not distributed.enabled:
        return items
    shares: list | None = [None] * distributed.world_size if distributed.is_main else None
    dist.gather_object(items, shares, dst=0)
    if shares is None:
        return []
    merged: list = [None] * sum(len(share) for share in shares)
    for rank, share in enumerate(shares):
        merged[rank :: distributed.world_size] = share
    return merged
