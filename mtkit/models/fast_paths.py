"""Which weight shapes run faster packed for oneDNN (`mtkit.models.packed`) on this machine: measured at the first
load that asks for the fast paths, and kept in a small JSON file of the user's cache folder.

Whether the laid-out weight beats the plain product depends on the CPU (its vector units and matrix engines, its
caches), on torch's build and on the threads: packing wins by a wide margin on one machine and less, or not at all,
on another. So the choice is not a fixed switch: each distinct (out, in) shape of the linears `pack_linears` would
pack is timed both ways on decoding-shaped inputs, and a later load of any model with that shape reads the answer.
The decision is per shape, not per model: the output layer's weight is far larger than the caches and the
feed-forward layers' is not, so one may win where the other loses; and models of one width share their shapes,
so one model's measurement serves the next. `MTKIT_FAST_PATHS=packed` or `plain` (`runtime.fast_paths_setting`)
decides instead, without measuring. What is measured and how to measure again: docs/performance.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mtkit.errors import MtkitError
from mtkit.models.packed import ROWS_HINT, pack_linears, pack_weight, packable_linears, packed_product
from mtkit.runtime import fast_paths_setting, user_cache_folder
from mtkit.textio import write_file

CACHE_FORMAT = 1  # raised when what is measured changes, so that older answers are measured again
MEASURED_ROWS = (5, 40)  # a beam-5 step of one sentence, and of eight
ROUNDS = 3  # timed turns of each side, after an untimed one (oneDNN builds a kernel per new number of rows)
BUDGET_S = 0.2  # a shape's turns stop once they have taken this long (after the first), so large layers stay short
MARGIN = 0.95  # packing keeps a second copy of the weight in memory: it has to be clearly faster
LARGEST_CACHE_FILE = 1 << 16  # bytes; a larger file is not mtkit's and is measured again
CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "flags", "CPU implementer", "CPU part", "Features")


def pack_where_faster(model: nn.Module) -> int:
    """Pack the large linears of `model` (`pack_linears`) whose weight shape runs faster packed on this machine;
    returns how many were packed. Shapes not yet in the cache file are measured (`measure_packing`) and written
    there; `MTKIT_FAST_PATHS=packed` packs them all and `plain` none, measuring nothing."""
    setting = fast_paths_setting()
    if setting in ("packed", "plain"):
        return pack_linears(model) if setting == "packed" else 0
    wins = cached_packing_wins(packable_linears(model))
    return pack_linears(model, where=lambda linear: wins[shape_name(linear)])


def cached_packing_wins(linears: list[nn.Linear]) -> dict[str, bool]:
    """For each weight shape of `linears` (`shape_name`), whether packing wins: read from this machine's cache
    file, else measured and the file rewritten (atomically). A missing, unreadable or damaged file is measured
    again; one that cannot be written leaves the answers to this load alone (the next measures again)."""
    if not linears:
        return {}
    key = machine_key()
    path = cache_file(key)
    known = read_cache(path, key)
    one_of_shape = {shape_name(linear): linear for linear in linears}
    measured = {name: measure_packing(linear) for name, linear in one_of_shape.items() if name not in known}
    if measured:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            kept = read_cache(path, key) | known | measured  # what another process wrote meanwhile stays
            write_file(path, json.dumps({"key": key, "packing_wins": kept}, indent=1, sort_keys=True) + "\n")
        except (OSError, MtkitError):  # a read-only or full cache folder costs a measurement per load, no more
            pass
    return known | measured


def shape_name(linear: nn.Linear) -> str:
    """The cache's name of `linear`'s weight shape: OUTxIN."""
    return f"{linear.out_features}x{linear.in_features}"


def measure_packing(linear: nn.Linear, *, clock: Callable[[], float] = time.perf_counter) -> bool:
    """Whether `linear`'s product on decoding-shaped inputs (`MEASURED_ROWS` rows) runs faster with its weight
    packed than with `F.linear`: both timed in turns, packing winning by `MARGIN`. A fraction of a second; the
    inputs come from a generator of their own, so the process's random state is left as it was."""
    try:
        packed = pack_weight(linear.weight)
    except (RuntimeError, AttributeError):  # an older or reduced oneDNN build: packing cannot win
        return False
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(rows, linear.in_features, generator=generator) for rows in MEASURED_ROWS]  # (rows, in)
    weight, bias = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
    with torch.no_grad():
        plain_s, packed_s = fastest_in_turns(
            lambda: [F.linear(x, weight, bias) for x in inputs],
            lambda: [packed_product(x, packed, bias=bias) for x in inputs],
            clock=clock,
        )
    return packed_s < MARGIN * plain_s


def fastest_in_turns(first: Callable[[], Any], second: Callable[[], Any], *, clock: Callable[[], float]) -> tuple[float, float]:
    """The fastest of a few timed runs of `first` and of `second`, taken in turns (A B A B) after one untimed run
    of each; the turns stop after `ROUNDS`, or earlier once they have taken `BUDGET_S`. The fastest run is the one
    least disturbed by other work on the machine."""
    first(), second()
    fastest = [math.inf, math.inf]
    start = clock()
    for _ in range(ROUNDS):
        for side, work in enumerate((first, second)):
            began = clock()
            work()
            fastest[side] = min(fastest[side], clock() - began)
        if clock() - start >= BUDGET_S:
            break
    return fastest[0], fastest[1]


def machine_key() -> dict[str, Any]:
    """What decides which product wins, and so names the cache file: the CPU (model and flags), torch's version
    and CPU capability (the kernels it dispatches to), its threads, and what is measured."""
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    return {
        "format": CACHE_FORMAT,
        "cpu": cpu_description(),
        "torch": torch.__version__,
        "capability": capability,
        "threads": torch.get_num_threads(),
        "rows": list(MEASURED_ROWS),
        "rows_hint": ROWS_HINT,
    }


def cpu_description() -> dict[str, str]:
    """The first processor's model and flags from /proc/cpuinfo (Linux: x86's or Arm's fields), else what
    `platform` knows."""
    found = {"machine": platform.machine()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line, _ in zip(cpuinfo, range(200), strict=False):  # the first processor's block is short
                name, _, value = line.partition(":")
                if not line.strip():
                    break
                if name.strip() in CPU_FIELDS:
                    found[name.strip()] = " ".join(value.split())
    except OSError:
        found["processor"] = platform.processor()
    return found


def cache_file(key: dict[str, Any]) -> Path:
    """This machine's file: the user's cache folder (`runtime.user_cache_folder`), fast-paths/DIGEST.json."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return user_cache_folder("fast-paths") / f"{digest}.json"


def read_cache(path: Path, key: dict[str, Any]) -> dict[str, bool]:
    """The answers `path` holds for `key`; none for a missing, unreadable, oversized or damaged file, or one
    written for another key."""
    try:
        if path.stat().st_size > LARGEST_CACHE_FILE:
            return {}
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, unreadable, not UTF-8, not JSON
        return {}
    if not isinstance(stored, dict) or stored.get("key") != key or not isinstance(stored.get("packing_wins"), dict):
        return {}
    return {name: wins for name, wins in stored["packing_wins"].items() if isinstance(wins, bool)}
