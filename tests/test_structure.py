"""How the code reads: short functions and classes, and no function outside a class that sets the fields of
one of its instances (a method moved out to fit a limit). Calls from a command to the model: tests/integration/."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import source_tree

PACKAGE = Path(__file__).resolve().parents[1] / "mtkit"
LONGEST_FUNCTION, LONGEST_CLASS = 50, 250


def definitions() -> list[tuple[str, ast.AST]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(source_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}", node))
    return found


def test_no_function_is_longer_than_50_lines_and_no_class_longer_than_250():
    too_long = [
        f"{where} ({node.end_lineno - node.lineno + 1} lines)"
        for where, node in definitions()
        if node.end_lineno - node.lineno + 1 > (LONGEST_CLASS if isinstance(node, ast.ClassDef) else LONGEST_FUNCTION)
    ]
    assert not too_long


def mtkit_classes() -> set[str]:
    return {node.name for _, node in definitions() if isinstance(node, ast.ClassDef)}


def instances_given(function: ast.FunctionDef | ast.AsyncFunctionDef, classes: set[str]) -> set[str]:
    """The parameters of `function` annotated with one of mtkit's classes."""
    arguments = function.args.posonlyargs + function.args.args + function.args.kwonlyargs
    return {
        arg.arg
        for arg in arguments
        if arg.annotation is not None and ast.unparse(arg.annotation).split("|")[0].strip().strip("'\"") in classes
    }


def fields_set(function: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, `name.field`) for every assignment to a field of one of `names` inside `function`."""
    found = []
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(element, ast.Attribute) and isinstance(element.value, ast.Name) and element.value.id in names:
                    found.append((node.lineno, ast.unparse(element)))
    return found


def test_no_module_level_function_sets_the_fields_of_an_instance_it_is_given():
    classes, offenders = mtkit_classes(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in source_tree(path).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where, found = path.relative_to(PACKAGE.parent), fields_set(node, instances_given(node, classes))
                offenders += [f"{where}:{line} {node.name} sets {field}" for line, field in found]
    assert not offenders


def test_the_field_check_finds_a_method_moved_out_of_its_class():
    moved = ast.parse("def step(trainer: Trainer, n: int) -> None:\n    trainer.progress, trainer.step = 1, n\n").body[0]
    assert fields_set(moved, instances_given(moved, {"Trainer"})) == [(2, "trainer.progress"), (2, "trainer.step")]
