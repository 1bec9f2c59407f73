"""Runtime settings that hold for a whole process: freed memory stays in the process, so re-allocating a
large tensor does not page-fault it in again (run in child processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHURN = """
import resource, sys
import torch
from mtkit.runtime import retain_freed_memory
took = retain_freed_memory() if sys.argv[1] == "retain" else None
for _ in range(10):  # the heap grows to its working size in the first few rounds
    torch.empty(64 * 2**20 // 4).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.empty(64 * 2**20 // 4).fill_(1.0)  # 64 MiB written, then freed: a training update's logits
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's; elsewhere it is a no-op")
def test_retained_memory_is_reused_without_page_faults():
    _, default_faults = page_faults("default")
    took, retained_faults = page_faults("retain")
    assert took == "True"
    assert default_faults > 20 * 64 * 2**20 // 4096 // 2  # glibc maps and unmaps the 64 MiB every time
    assert retained_faults < default_faults / 10
