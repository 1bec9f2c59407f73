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


# A block freed below another still in use: glibc's heap keeps it resident, an mmap'd block goes back to the kernel.
HOLE = """
import sys
import torch
from mtkit.runtime import return_freed_memory
took = return_freed_memory() if sys.argv[1] == "return" else None

def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

torch.empty(16 * 2**20 // 4).fill_(1.0)  # freed at once: glibc now serves blocks up to 16 MiB from its heap
block = torch.empty(8 * 2**20 // 4).fill_(1.0)  # a layer's gathered weights, say
pin = torch.empty(256 * 2**10 // 4).fill_(1.0)  # something allocated after it, still in use
before = resident_mib()
del block
print(took, before - resident_mib())
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's; elsewhere it is a no-op")
def test_returned_memory_leaves_no_resident_hole():
    def handed_back(mode: str) -> tuple[str, float]:
        out = subprocess.run([sys.executable, "-c", HOLE, mode], capture_output=True, text=True, check=True).stdout.split()
        return out[0], float(out[1])

    _, kept_by_default = handed_back("default")
    took, returned = handed_back("return")
    assert took == "True"
    assert kept_by_default < 1  # the 8 MiB stay resident, in a hole under the block still in use
    assert returned > 7
