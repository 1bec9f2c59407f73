"""Option objects are built by name: every class here is a keyword-only frozen dataclass, and no call in
mtkit/, tests/ or benchmarks/ passes one a positional argument (a field added in the middle of a
positional call would bind silently to the wrong one)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from mtkit.decoding.files import FileOptions
from mtkit.decoding.sampling import Sampling
from mtkit.decoding.search import SearchOptions
from mtkit.decoding.translator import Decoding
from mtkit.evaluation.report import EvaluateRequest
from mtkit.evaluation.significance import PairedTests
from mtkit.serving.app import ServeLimits

OPTION_CLASSES = [Decoding, SearchOptions, FileOptions, EvaluateRequest, ServeLimits, Sampling, PairedTests]
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("option_class", OPTION_CLASSES, ids=lambda c: c.__name__)
def test_option_classes_are_keyword_only_and_frozen(option_class):
    assert option_class.__dataclass_params__.frozen
    assert all(field.kw_only for field in dataclasses.fields(option_class))
    with pytest.raises(TypeError, match="positional"):
        option_class(1)


def positional_option_calls(path: Path) -> list[str]:
    """`file:line Class` for each call of an option class with a positional argument in `path`."""
    names = {option_class.__name__ for option_class in OPTION_CLASSES}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and node.args:
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in names:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {name}")
    return found


def test_no_option_object_is_built_positionally():
    files = [path for folder in ("mtkit", "tests", "benchmarks") for path in sorted((REPO / folder).rglob("*.py"))]
    assert [call for path in files for call in positional_option_calls(path)] == []
