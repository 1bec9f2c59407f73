"""The test tiers stay apart: unit tests (tests/<subpackage>/, tests/test_<module>.py) neither train past a few
updates nor start anything; integration/ holds what trains a model or runs commands end to end; system/ holds
what starts processes, servers or browsers. Read from the files' syntax, so it costs no collection."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import SLOW_FIXTURES, SLOW_TIERS, source_tree

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "mtkit"
DATA_FOLDERS = {"corpus", "fixtures", "__pycache__"}  # test data, not tests
# What starts a process, a server or a browser: modules imported, helpers called, fixtures used.
STARTING_MODULES = {"subprocess", "multiprocessing", "selenium"}
STARTING_HELPERS = {"serving", "free_port", "torchrun_mtkit"}
STARTING_FIXTURES = {"server", "browser"}


def tier_of(path: Path) -> str:
    folder = path.relative_to(TESTS).parts[0]
    return folder if folder in SLOW_TIERS else "unit"


def files_of(*tiers: str) -> list[Path]:
    """The test files of the given tiers ("unit": every test file outside the slow tiers' folders)."""
    return [path for path in sorted(TESTS.rglob("test_*.py")) if tier_of(path) in tiers]


def fixtures_of(tree: ast.Module) -> dict[str, set[str]]:
    """Each fixture defined at the top of a module, with the fixtures it asks for."""
    return {
        node.name: {arg.arg for arg in node.args.args} | used_fixtures(node)
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list)
    }


def used_fixtures(node: ast.AST) -> set[str]:
    """Fixtures named in `usefixtures(...)` or `request.getfixturevalue(...)` anywhere in `node`."""
    return {
        arg.value
        for call in ast.walk(node)
        if isinstance(call, ast.Call) and ast.unparse(call.func).endswith(("usefixtures", "getfixturevalue"))
        for arg in call.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    }


def reachable(names: set[str], fixtures: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    while names - seen:
        name = (names - seen).pop()
        seen.add(name)
        names |= fixtures.get(name, set())
    return seen


def slow_tests(path: Path, shared: dict[str, set[str]]) -> list[str]:
    """The names of the tests in `path` marked slow, or reaching a slow fixture through the fixtures they ask for."""
    tree = source_tree(path)
    fixtures = {**shared, **fixtures_of(tree)}
    module_marks = [ast.unparse(node) for node in tree.body if isinstance(node, ast.Assign) and "pytestmark" in ast.unparse(node)]
    module_fixtures = {name for mark in module_marks for name in used_fixtures(ast.parse(mark))}
    found = []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        marks = [ast.unparse(d) for d in node.decorator_list] + module_marks
        asked = {arg.arg for arg in node.args.args} | used_fixtures(node) | module_fixtures
        if any("mark.slow" in mark for mark in marks) or reachable(asked, fixtures) & SLOW_FIXTURES:
            found.append(node.name)
    return found


def what_starts_things(path: Path) -> set[str]:
    """The modules, helpers and fixtures in `path` that start a process, a server or a browser."""
    tree = source_tree(path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names} & STARTING_MODULES
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in STARTING_MODULES:
                found.add(node.module.split(".")[0])
            if node.module == "helpers":
                found |= {alias.name for alias in node.names} & STARTING_HELPERS
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            found |= {arg.arg for arg in node.args.args} & STARTING_FIXTURES
    return found


def test_no_unit_test_is_marked_slow_or_uses_a_slow_fixture():
    shared = fixtures_of(ast.parse((TESTS / "shared_fixtures.py").read_text(encoding="utf-8")))
    misplaced = [f"{path.relative_to(TESTS)}::{test}" for path in files_of("unit") for test in slow_tests(path, shared)]
    assert not misplaced, f"move these to tests/integration/ or tests/system/ (docs/development.md): {misplaced}"


def test_the_checks_find_a_slow_test_and_what_starts_a_process(tmp_path):
    unit = tmp_path / "test_example.py"
    unit.write_text(
        "import subprocess\nimport pytest\nfrom helpers import serving\n\n"
        "@pytest.fixture\ndef trained(reverse_run):\n    return reverse_run\n\n"
        "def test_uses_it(trained):\n    pass\n\n@pytest.mark.slow\ndef test_marked():\n    pass\n\n"
        "def test_fast(tmp_path):\n    pass\n"
    )
    assert slow_tests(unit, {}) == ["test_uses_it", "test_marked"]
    assert what_starts_things(unit) == {"subprocess", "serving"}


def test_only_system_tests_start_processes_servers_or_browsers():
    starting = {str(path.relative_to(TESTS)): what_starts_things(path) for path in files_of("unit", "integration")}
    assert not {path: found for path, found in starting.items() if found}, "move these tests to tests/system/"


def test_every_system_file_starts_a_process_a_server_or_a_browser():
    idle = [str(path.relative_to(TESTS)) for path in files_of("system") if not what_starts_things(path)]
    assert not idle, f"these start nothing: move them to tests/integration/ or the unit tier: {idle}"


def test_test_folders_mirror_the_package_and_the_slow_tiers_are_packages():
    """tests/<subpackage>/ in every tier; the slow tiers' folders hold an __init__.py, so that a slow file may share
    its unit file's name (tests/integration/training/test_trainer.py beside tests/training/test_trainer.py)."""
    subpackages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    stray, not_packages = [], []
    for folder in sorted(path for path in TESTS.rglob("*") if path.is_dir()):
        parts = folder.relative_to(TESTS).parts
        if DATA_FOLDERS & set(parts) or parts in {(tier,) for tier in SLOW_TIERS}:
            continue
        if parts[-1] not in subpackages or len(parts) > (2 if parts[0] in SLOW_TIERS else 1):
            stray.append("/".join(parts))
        if parts[0] in SLOW_TIERS and not (folder / "__init__.py").is_file():
            not_packages.append("/".join(parts))
    not_packages += [tier for tier in SLOW_TIERS if not (TESTS / tier / "__init__.py").is_file()]
    assert not stray, f"test folders must be named after a package of mtkit/: {stray}"
    assert not not_packages, f"add an empty __init__.py to: {not_packages}"


def test_under_make_test_each_test_runs_in_its_group(request: pytest.FixtureRequest) -> None:
    """`make test` runs `--dist loadgroup`: a test file's tests, and every user of one trained session fixture, run
    in one worker (tests/conftest.py gives the groups). pytest-xdist says a test's group by suffixing its node id;
    where that suffix is lost (pytest 9.2 with pytest-xdist 3.8, pytest-xdist #1386) every group is split and its
    fixtures are trained once per worker, silently."""
    if getattr(request.config.option, "loadgroup", False) is not True:
        pytest.skip("not under pytest-xdist's --dist loadgroup")
    assert request.node.nodeid.endswith("@test_tiers.py"), request.node.nodeid
