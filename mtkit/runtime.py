"""Where and how tensors are computed: device choice, CPU threads, mixed precision, seeding."""

from __future__ import annotations

import contextlib
import os
import random

import numpy as np
import torch

from mtkit.errors import MtkitError


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' is CUDA when present, else CPU; 'cuda' without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MtkitError(f"device {name!r} asked for, but no CUDA GPU is available; use --set train.device=cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise MtkitError(f"device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None


def cpu_cores() -> int:
    """The cores this process may run on (its affinity mask, which `taskset` and containers narrow)."""
    return max(1, len(os.sched_getaffinity(0)))


def set_threads(threads: int) -> None:
    """Use `threads` CPU threads for torch (0 = one per core)."""
    torch.set_num_threads(threads or cpu_cores())


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """bf16 (or fp16) autocast on CUDA; CPU always computes in fp32 (no fast bf16 there).

    On CUDA, fp32 matrix multiplies (those autocast leaves in fp32, or all with `fp32`) use TF32
    tensor cores on Ampere and newer GPUs.
    """
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if device.type != "cuda" or precision == "fp32":
        return None
    if precision == "fp16":
        return torch.float16
    if precision == "bf16" or torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float16


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
