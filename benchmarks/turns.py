"""Systems timed in turns, each timed run a process of its own: what benchmarks/opus_mt.py and benchmarks/nllb.py share.

A script's `child(task)` builds one system, warms it up and times it once; `in_own_process` runs it in a fresh
interpreter (`python -m benchmarks.NAME --child TASK`, answered by `answer_child`), so what one system sets for
its process (mtkit keeps freed heap memory, for one) never reaches another, and `alternate` lets the systems
take turns (A B A B ...), so a machine that slows down slows every system alike.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks import common


def timed(run: Callable[[], object]) -> float:
    """Seconds that `run()` took."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def in_own_process(module: str, task: dict) -> Any:
    """`child(task)` of the benchmark `module` in a fresh process; what it answered (JSON)."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--child", json.dumps(task)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        cwd=common.ROOT,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])["result"]


def answer_child(child: Callable[[dict], Any], task: str) -> None:
    """Run `child` on the JSON task given by --child and print its result as `in_own_process` reads it."""
    print(json.dumps({"result": child(json.loads(task))}))


def alternate(task: dict, systems: list[str], repeats: int, run: Callable[[dict], Any]) -> dict[str, list[Any]]:
    """What each system's run gave per repeat, each run by `run` (a fresh process), the systems taking turns (A B C A B C ...)."""
    found: dict[str, list[Any]] = {name: [] for name in systems}
    for _ in range(repeats):
        for name in systems:
            found[name].append(run({**task, "system": name}))
    return found


def report(title: str, seconds: dict[str, float], baseline: str) -> None:
    """A table of each system's seconds and its speed against `baseline` (baseline's seconds / its own)."""
    print(title)
    for name, value in seconds.items():
        print(f"  {name:<24} {value:8.2f} s   {seconds[baseline] / value:5.2f}x {baseline}")
