"""Where and how tensors are computed: device choice, CPU threads, mixed precision, seeding.

The one place for process-wide settings (threads, the allocator, TF32, cuDNN flags, signal
handlers): front ends (the CLI commands, the server, the benchmarks) call these functions; the
library's `train()` calls them for its own run and says so. Loading a model changes none of them
unless the caller asks for the fast paths (`Translator.load(..., fast_paths=True)`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


def set_threads_per_worker(workers: int) -> None:
    """Give each of `workers` decoding threads its share of the cores: torch's threads are cores // workers.

    torch's intra-op threads are process-wide; workers that each used all cores would wait for each other.
    """
    torch.set_num_threads(max(1, cpu_cores() // max(1, workers)))


FAST_PATHS_VARIABLE = "MTKIT_FAST_PATHS"
FAST_PATHS_SETTINGS = ("0", "1", "packed", "plain")


def fast_paths_enabled() -> bool:
    """Whether mtkit may apply its CPU fast paths where they are asked for; `MTKIT_FAST_PATHS=0` turns them all off.

    They are: `retain_freed_memory` (process-wide, glibc's allocator) when training on CPU (or, for sharded
    training, `return_freed_memory`) or loading
    a model with `fast_paths=True`, and `mtkit.models.packed.pack_linears` (the loaded model's large
    linears, private oneDNN ops) when loading a model with `fast_paths=True`, for the weight shapes that
    a measurement on this machine found faster packed (`mtkit.models.fast_paths`). The front ends ask for
    them (the CLI, the server, the benchmarks; measured in docs/performance.md); a library call that
    does not ask leaves the process as it is. The variable wins over the argument: set it to 0 to
    debug, or when mtkit runs inside another program whose allocator settings it should not change.
    """
    return fast_paths_setting() != "0"


def fast_paths_setting() -> str:
    """`MTKIT_FAST_PATHS`: 0 (off), 1 (on, packing where measured faster: the default, also unset or empty),
    `packed` or `plain` (on, with the large linears always or never packed: the user's word over the measurement)."""
    value = os.environ.get(FAST_PATHS_VARIABLE, "1").strip() or "1"
    if value not in FAST_PATHS_SETTINGS:
        raise MtkitError(
            f"{FAST_PATHS_VARIABLE}={value!r}: give 0 (fast paths off) or 1 (on, the default), "
            "or packed or plain (on, large linears always or never packed)"
        )
    return value


def user_cache_folder(name: str) -> Path:
    """mtkit's cache folder `name` for this user: $MTKIT_CACHE_DIR/NAME, else $XDG_CACHE_HOME/mtkit/NAME, else
    ~/.cache/mtkit/NAME (compiled code, the fast paths' measurements)."""
    if root := os.environ.get("MTKIT_CACHE_DIR"):
        return Path(root) / name
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mtkit" / name


def retain_freed_memory() -> bool:
    """Keep freed heap memory in the process for reuse instead of handing it back to the kernel.

    Every training update frees and re-allocates the same large tensors (activations, logits and
    their gradients). glibc serves such blocks with mmap and unmaps them on free, so the next update
    page-faults all of that memory in again (docs/performance.md has the cost). With mmap off and a
    1 GiB trim threshold,
    freed blocks are reused. Only glibc on Linux has `mallopt`; elsewhere this does nothing.
    Returns whether it took effect.
    """
    mallopt = _mallopt()
    if mallopt is None:
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # from glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 1 << 30))


def return_freed_memory() -> bool:
    """Hand every freed block of a mebibyte or more back to the kernel at once, the opposite of `retain_freed_memory`:
    for sharded training on the CPU (`train.shard: fsdp`), whose layers' gathered weights and gradients come and go
    within each update, so that what sharding saves is not kept. glibc serves a block with mmap only from a threshold
    up, and raises the threshold to the size of each mmap'd block freed (to its DEFAULT_MMAP_THRESHOLD_MAX): the blocks
    under it come from the heap, where freed blocks of many sizes leave holes that stay resident. A fixed threshold
    stops the raising. Only glibc on Linux has `mallopt`; elsewhere this does nothing. Returns whether it took effect.
    """
    mallopt = _mallopt()
    m_mmap_threshold = -3  # from glibc's malloc.h; setting it turns the moving threshold off
    return mallopt is not None and bool(mallopt(m_mmap_threshold, 1 << 20))


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's mallopt, or None (not Linux, or another C library: musl, ...)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def stop_signals_call(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Within the block, SIGINT (Ctrl-C) and SIGTERM call `handler` instead of their usual action;
    the handlers installed before are put back on leaving it (a process-wide setting, main thread only)."""
    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, former in previous.items():
            signal.signal(signum, former)


def enable_tf32(device: torch.device) -> None:
    """On CUDA, let fp32 matrix multiplies and convolutions use TF32 tensor cores (Ampere and newer).

    These are process-wide flags: they also hold for the matrix multiplies autocast leaves in fp32,
    and for all of them with `precision: fp32`. On CPU this does nothing.
    """
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def avoid_per_shape_attention_plans(device: torch.device, *, cudnn: bool = False) -> None:
    """On CUDA, take cuDNN's kernel out of `scaled_dot_product_attention`'s choices (process-wide), unless
    `cudnn` (`train.cudnn_attention: true`) keeps it among them.

    cuDNN builds an execution plan for every new (batch, length) shape, so training on shapes not
    seen before ran many times slower on an H100 (figures in docs/performance.md); once every shape
    has a plan, both kernels run at the same speed. The flash and memory-efficient kernels have no
    per-shape cost. With bounded shapes (`train.shapes`) the plans are made once each. On CPU this does nothing.
    """
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(cudnn)


def key_compiled_cpu_code_by_vector_width() -> None:
    """Pin Inductor's CPU vector width (`torch._inductor.config.cpp.simdlen`, process-wide) to the one it would
    pick anyway, so that its compile cache tells an AVX2 process's code from an AVX-512 one's.

    Inductor picks the width from the CPU and ATEN_CPU_CAPABILITY, but leaves it out of its FX-graph cache
    key (torch 2.13): a process reusing another width's generated C++ compiles it for its own width, and
    the kernels then write past their buffers (glibc "corrupted size vs. prev_size" with AVX-512 reading
    AVX2's code) or leave half of each vector unwritten (non-finite losses the other way). Both share
    /tmp/torchinductor_<user> and `train.compile_cache` files. `simdlen` is in the key; pinned to the
    picked width (0 where none is: the scalar kernels) the code is the same. A width already set is kept.
    """
    from torch._inductor import config as inductor_config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    if inductor_config.cpp.simdlen is None:
        inductor_config.cpp.simdlen = pick_vec_isa().bit_width()


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """bf16 (or fp16) autocast on CUDA; CPU always computes in fp32 (no fast bf16 there). No side effects."""
    if device.type != "cuda" or precision == "fp32":
        return None
    if precision == "fp16":
        return torch.float16
    if precision == "bf16" or torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float16


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast to `dtype` on `device`; no autocast when `dtype` is None (fp32)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's random number generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
