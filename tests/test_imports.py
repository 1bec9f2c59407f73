"""The package reads as a pipeline: imports run one way, from the CLI down to the shared modules.

Stages, highest first: cli, exporters (they read the importers' name tables), importers, serving,
training, evaluation, synthetic, decoding, models, data, and the shared top-level modules (config,
errors, textio, ...). A module imports its own stage or lower ones, never a higher one; no import
cycle; an import inside a function is for keeping `mtkit --help` fast (the CLI and the package's
lazy `Translator`) or for an optional extra, never for an mtkit module elsewhere; and a name is
imported from the module that defines it, not through another one.
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

from helpers import source_tree

PACKAGE = Path(__file__).resolve().parents[1] / "mtkit"
STAGES = [
    "cli", "exporters", "importers", "serving", "training", "evaluation", "documents", "synthetic", "decoding", "models", "data",
    "shared",
]  # fmt: skip
LAZY_ALLOWED = {"mtkit.cli", "mtkit"}  # the CLI imports torch-heavy stages per command; `mtkit.Translator` is lazy
MOST_TOP_LEVEL_MODULES = 10


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("cli", "__main__"):
        return "cli"
    return parts[1] if parts[1] in STAGES else "shared"


def modules() -> dict[str, ast.Module]:
    return {module_name(path): source_tree(path) for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(tree: ast.Module) -> list[tuple[str, list[str], bool]]:
    """(module, names, inside a function or class body) for every `import mtkit...` / `from mtkit... import`."""
    found = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and child.module and child.module.split(".")[0] == "mtkit":
                found.append((child.module, [alias.name for alias in child.names], nested))
            elif isinstance(child, ast.Import):
                found.extend((alias.name, [], nested) for alias in child.names if alias.name.split(".")[0] == "mtkit")
            visit(child, inner)

    visit(tree, False)
    return found


def defined_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return names


def test_a_lower_stage_never_imports_a_higher_one():
    upward = [
        f"{module} ({stage(module)}) imports {imported} ({stage(imported)})"
        for module, tree in modules().items()
        for imported, _, _ in imports_of(tree)
        if STAGES.index(stage(imported)) < STAGES.index(stage(module))
    ]
    assert not upward


def test_there_is_no_import_cycle():
    graph = defaultdict(set)
    all_modules = modules()
    for module, tree in all_modules.items():
        for imported, names, _ in imports_of(tree):
            targets = [f"{imported}.{name}" for name in names if f"{imported}.{name}" in all_modules] or [imported]
            graph[module] |= {target for target in targets if target != module and target in all_modules}
    cycles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(all_modules):
        if module not in state:
            visit(module, [module])
    assert not cycles


def test_mtkit_modules_are_imported_at_the_top_except_by_the_cli():
    lazy = [
        f"{module} imports {imported} inside a function"
        for module, tree in modules().items()
        if module not in LAZY_ALLOWED
        for imported, _, nested in imports_of(tree)
        if nested
    ]
    assert not lazy


def test_names_are_imported_from_the_module_that_defines_them():
    all_modules = modules()
    defined = {module: defined_names(tree) for module, tree in all_modules.items()}
    borrowed = [
        f"{module} imports {name} from {imported}, which does not define it"
        for module, tree in all_modules.items()
        if module != "mtkit"
        for imported, names, _ in imports_of(tree)
        for name in names
        if imported in defined and name not in defined[imported] and f"{imported}.{name}" not in all_modules
    ]
    assert not borrowed


def test_the_top_level_holds_at_most_ten_modules():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MOST_TOP_LEVEL_MODULES, top


def test_every_module_imports():
    for module in modules():
        if module != "mtkit.__main__":  # it runs the CLI
            importlib.import_module(module)
