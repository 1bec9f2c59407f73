"""The tests' pytest hooks, for every tier: each pytest-xdist worker on a core of its own with one torch thread,
integration/ and system/ (and every test using a fixture that trains) marked slow, and each file's xdist group.
The shared fixtures are in shared_fixtures.py, which every process that runs tests registers as a plugin here;
pytest-xdist's controller, which runs none, then starts its workers without first importing torch and mtkit
(about 3 s). Plain helpers and constants are in helpers.py."""

from __future__ import annotations

import atexit
import functools
import gc
import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs `-n auto --dist loadgroup`), each worker keeps to a core of its own:
    its torch threads and its subprocesses' (mtkit gives torch one thread per core it may run on) then never
    wait for the other worker's. Without xdist too, torch runs the tests on one thread, as the tests' recipes
    train (`threads: 1`): a test run alone then finds the thread count a training leaves."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker and getattr(config.option, "numprocesses", None):
        return  # pytest-xdist's controller: its workers collect and run the tests
    import torch
    import typer.main
    import typer.testing

    cores = sorted(os.sched_getaffinity(0))
    if worker.startswith("gw") and len(cores) > 1:
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})
    torch.set_num_threads(1)  # torch counted the cores when it was imported: two threads on one core spin
    # Typer's CliRunner builds the click command tree from the app on every invoke (about 50 ms); the tests invoke
    # the same app a few thousand times, so each worker builds it once.
    typer.testing._get_command = functools.cache(typer.main.get_command)
    config.pluginmanager.import_plugin("shared_fixtures")
    atexit.register(gc.freeze)  # the worker's exit skips the last collections over torch's objects (as mtkit.cli.main)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the tests are collected, what the imports made (torch's, transformers' and mtkit's objects, most of a
    worker's heap) goes to the collector's permanent generation: its full collections, during the tests and in
    pytest's own at the end, then walk only what the tests make."""
    gc.freeze()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's hook, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `slow` every test under integration/ and system/, and every test that uses a slow fixture
    (tests/test_tiers.py keeps the second kind out of the unit tier); and give each test its group for
    pytest-xdist's `--dist loadgroup` (`worker_groups`), the groups of trained session fixtures first, then the
    system, integration and unit tiers: `make test` hands groups out in this order (`--no-loadscope-reorder`),
    so the long ones start first and the short ones fill in at the end."""
    from helpers import SLOW_FIXTURES, SLOW_TIERS

    groups = worker_groups(items)
    items.sort(key=lambda item: start_rank(groups[item.path]))  # stable: a group's tests keep their order
    for item in items:
        in_slow_tier = item.path.is_relative_to(TESTS) and item.path.relative_to(TESTS).parts[0] in SLOW_TIERS
        if in_slow_tier or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.xdist_group(groups[item.path]))


def worker_groups(items: list[pytest.Item]) -> dict[Path, str]:
    """Each test file's pytest-xdist group: the first trained session fixture of `SHARED_RUNS` that a test of the
    file uses, or else the file itself. A file's tests then run in one worker (its module fixtures are built once),
    and so do all the users of one session fixture (it is trained once)."""
    groups: dict[Path, str] = {}
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        shared = next((group for group, names in SHARED_RUNS.items() if used & names), None)
        if shared and groups.get(item.path) not in SHARED_RUNS:
            groups[item.path] = shared
        name = str(item.path.relative_to(TESTS))
        groups.setdefault(item.path, TRANSFORMERS_GROUP if name in TRANSFORMERS_USERS else name)
    return groups


def start_rank(group: str) -> int:
    """0 for a trained session fixture's group, 1 for a system test file, 2 integration, 3 the unit files that
    import transformers, 4 the other unit files."""
    if group in SHARED_RUNS:
        return 0
    return {"system": 1, "integration": 2, TRANSFORMERS_GROUP: 3}.get(group.split("/")[0], 4)


# The unit files whose tests import transformers (1.4 s in a process): one group, so that one worker pays for the
# import, not both; the largest unit group, so handed out first among them. A file missing here costs only time.
TRANSFORMERS_GROUP = "unit files that import transformers"
TRANSFORMERS_USERS = {
    "evaluation/test_comet.py", "evaluation/test_filters.py", "evaluation/test_report.py", "evaluation/test_rerank.py",
    "exporters/test_formats.py", "exporters/test_remote_code.py", "importers/test_families.py", "importers/test_marian.py",
    "models/test_lora_peft.py",
    "test_imports.py", "training/test_validation_metric.py",
}  # fmt: skip


# Session fixtures that train, by the group of the tests that use them (a test of one trains what the group needs).
SHARED_RUNS = {
    "cli_workspace": {"cli_workspace", "cli_run"},
    "tagged_run": {"tagged_run"},
    "reverse_run": {"reverse_run", "reverse_rnn_run", "reverse_export", "model_run", "synthetic_prepared"},
}
