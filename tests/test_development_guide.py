"""docs/development.md stays true where a test can check it: its layout names every module of the package
in its folder (and nothing that is gone), the structure limits it states are the ones tests/test_structure.py
enforces, and the code's docstrings hold no measured figure (figures live in docs/performance.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import source_tree

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mtkit"
GUIDE = REPO / "docs" / "development.md"
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w.]+(?:\.py|\.html|/))(?:\s|$)")

# A number with a unit of time, memory, speed or ratio: the form a measurement takes.
FIGURE = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
    r"(?:\s?(?:ms|µs|us|s|secs?|seconds?|min|minutes?|h|hours?|[KMGT]i?B|kB|bytes/s|tokens/s|sent/s|sentences/s"
    r"|lines/s|updates/s|[GT]FLOP/s|%)|[x×])(?![\w/])"
)
# (module, figure) pairs whose number is not a measurement: a setting, an example of a format, arithmetic.
NOT_MEASURED = {
    ("mtkit/config.py", "5400.0 seconds"),  # parse_duration's examples
    ("mtkit/config.py", "2h"),
    ("mtkit/config.py", "30s"),
    ("mtkit/evaluation/significance.py", "95%"),  # the confidence level of the intervals
    ("mtkit/serving/limits.py", "64 KiB"),  # the room body_limit leaves for the options
    ("mtkit/runtime.py", "1 GiB"),  # the trim threshold retain_freed_memory sets
    ("mtkit/training/trainer.py", "3.2 min"),  # the progress line's format, by example
    ("mtkit/training/trainer.py", "11.8 min"),
    ("mtkit/training/batches.py", "5x"),  # temperature_weights' arithmetic, by example
    ("mtkit/training/batches.py", "1.38x"),
}


def layout_paths(guide: str) -> set[str]:
    """The paths the '## Package layout' block names, each under the folders it is indented below."""
    block = guide.split("## Package layout", 1)[1].split("```")[1]
    folders: list[str] = []
    paths = set()
    for line in block.splitlines():
        entry = ENTRY.match(line)
        if entry is None or len(entry["indent"]) % 2 or len(entry["indent"]) // 2 > len(folders):
            continue  # prose, or a description's continuation line (indented past any entry)
        del folders[len(entry["indent"]) // 2 :]
        path = "".join(folders) + entry["name"]
        paths.add(path.rstrip("/"))
        if entry["name"].endswith("/"):
            folders.append(entry["name"])
    return paths


def figures_in(tree: ast.Module) -> list[tuple[str, str]]:
    """(where, figure) for every measured-looking figure in the module, class and function docstrings of `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node) or ""
            where = getattr(node, "name", "the module docstring")
            found += [(where, figure.group()) for figure in FIGURE.finditer(docstring)]
    return found


def test_the_layout_names_every_module_in_its_folder_and_nothing_that_is_gone():
    named = layout_paths(GUIDE.read_text(encoding="utf-8"))
    modules = {str(path.relative_to(REPO)) for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"}
    packages = {str(path.parent.relative_to(REPO)) for path in PACKAGE.rglob("__init__.py")}
    assert not sorted((modules | packages) - named), "docs/development.md's layout leaves these out"
    gone = sorted(path for path in named if path.startswith("mtkit") and not (REPO / path).exists())
    assert not gone, "docs/development.md's layout names files that are not in mtkit/"


def test_the_layout_reader_follows_the_indentation():
    block = (
        "## Package layout\n```\nmtkit/\n  cli.py  the commands\n  data/\n    store.py  the store;\n"
        "              more.py words\n  x.py\n```"
    )
    assert layout_paths(block) == {"mtkit", "mtkit/cli.py", "mtkit/data", "mtkit/data/store.py", "mtkit/x.py"}


def structure_limits() -> dict[str, int]:
    """The module-level integer constants of the tests/**/test_structure.py files (the unit tier's and the integration tier's)."""
    limits = {}
    nodes = [
        node for path in REPO.glob("tests/**/test_structure.py") for node in ast.parse(path.read_text(encoding="utf-8")).body
    ]
    for node in nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.Constant)):
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            limits |= {
                t.id: v.value
                for t, v in zip(targets, values, strict=True)
                if isinstance(v, ast.Constant) and isinstance(v.value, int)
            }
    return limits


def test_the_guide_states_the_limits_the_structure_tests_enforce():
    guide = " ".join(GUIDE.read_text(encoding="utf-8").split())  # one line: a sentence may wrap anywhere
    stated = {
        "TRANSLATE_TO_SEARCH_CALLS": r"from the `translate` command to the engine's search at (\d+) calls or fewer",
        "TRAIN_TO_FORWARD_CALLS": r"from the `train` command to the model's forward pass at (\d+) or fewer",
        "LONGEST_FUNCTION": r"every function at most (\d+) lines",
        "LONGEST_CLASS": r"every class at most (\d+)",
    }
    limits = structure_limits()
    for constant, pattern in stated.items():
        found = re.search(pattern, guide)
        assert found, f"docs/development.md no longer says {pattern!r}"
        assert int(found.group(1)) == limits[constant], (
            f"the guide says {found.group(0)!r}; the test's {constant} is {limits[constant]}"
        )


def test_no_docstring_holds_a_measured_figure():
    found = [
        f"{path.relative_to(REPO)}: {where}: {figure}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for where, figure in figures_in(source_tree(path))
        if (str(path.relative_to(REPO)), figure) not in NOT_MEASURED
    ]
    assert not found, "measured figures belong in docs/performance.md; a docstring says why"


def test_the_figure_check_finds_a_planted_figure():
    planted = (
        '"""Fast."""\n\nclass Step:\n    def run(self):\n'
        '        """Takes 12.5 ms a step, 1,200 tokens/s, 2.3x faster, 40% of it."""\n'
    )
    assert [figure for _, figure in figures_in(ast.parse(planted))] == ["12.5 ms", "1,200 tokens/s", "2.3x", "40%"]
    assert figures_in(ast.parse('"""64-bit hashes, 8 bytes a pair, d_model 512, 3 sentences."""')) == []
