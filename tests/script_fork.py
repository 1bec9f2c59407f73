"""`python -m MODULE ARGUMENTS` as a child of a fork server that has imported torch and mtkit once (multiprocessing's
forkserver with `PRELOAD`): the script starts in a fraction of a second instead of the 3-5 s its imports take, and
each run is still a process of its own, with its own settings, threads, signal handlers and exit status."""

from __future__ import annotations

import multiprocessing
import os
import runpy
import sys
from multiprocessing.context import ForkServerContext
from pathlib import Path

import torch

# What every benchmark script imports first (torch, benchmarks.common with mtkit's decoding), what most smoke modes
# then import to train their tiny model (the trainer, and torch._dynamo, which torch's optimizers import), and what
# the ones that build, load or score with transformers' models import (its modeling_utils).
PRELOAD = [
    "torch", "torch._dynamo", "transformers.modeling_utils", "benchmarks.common", "mtkit.training.trainer", "script_fork"
]  # fmt: skip


def fork_server() -> ForkServerContext:
    """multiprocessing's forkserver context, its server (started by the first process) importing `PRELOAD`."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def run_module(module: str, arguments: list[str], cwd: Path, core: int, stdout: Path, stderr: Path) -> None:
    """In the forked child: `python -m module arguments` run in `cwd` on one `core`, its output written to two files.
    An exception ends the child with status 1 and its traceback in `stderr`; `sys.exit(n)`, with status n."""
    os.sched_setaffinity(0, {core})  # before the script starts a thread or a process: they inherit it
    torch.set_num_threads(1)  # as torch would have counted the cores at its import in a process on one core
    os.chdir(cwd)
    for descriptor, path in ((1, stdout), (2, stderr)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, descriptor)
        os.close(opened)
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
