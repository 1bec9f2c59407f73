"""Option objects and the functions with many options are called by name: every option class here is a
keyword-only frozen dataclass, each function or constructor listed takes at most its subject positionally,
and no call in mtkit/, tests/ or benchmarks/ passes either more positional arguments than that (a field or
parameter added in the middle of a positional call would bind silently to the wrong one)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import source_tree

from mtkit.decoding.heatmaps import plot_attention
from mtkit.decoding.options import Decoding, FileOptions, Sampling
from mtkit.decoding.pair_scores import score_pairs
from mtkit.decoding.search import SearchOptions
from mtkit.decoding.terminology.constrained import TermRequest
from mtkit.evaluation.report import EvaluateRequest
from mtkit.evaluation.significance import PairedTests
from mtkit.serving.app import ServeLimits, run_server
from mtkit.serving.batcher import Batcher, QueuedRequest
from mtkit.synthetic.jobs import SyntheticJob
from mtkit.training.levers import Levers
from mtkit.training.run_writer import Checkpoint
from mtkit.training.validation import validate

OPTION_CLASSES = [
    Decoding, SearchOptions, FileOptions, EvaluateRequest, ServeLimits, Sampling, PairedTests, SyntheticJob, QueuedRequest,
    Levers, Checkpoint, TermRequest,
]  # fmt: skip
# Their first argument, the obvious subject (a translator, a model, an engine), may stay positional; the rest by name.
KEYWORD_CALLABLES: list[Callable] = [Batcher, validate, run_server, plot_attention, score_pairs]
REPO = Path(__file__).resolve().parents[1]


def positional_limit(function: Callable) -> int:
    """How many arguments `function` (or a class's constructor) takes positionally."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(parameter.kind in kinds for parameter in inspect.signature(function).parameters.values())


LIMITS = {option_class.__name__: 0 for option_class in OPTION_CLASSES} | {
    function.__name__: positional_limit(function) for function in KEYWORD_CALLABLES
}


@pytest.mark.parametrize("option_class", OPTION_CLASSES, ids=lambda c: c.__name__)
def test_option_classes_are_keyword_only_and_frozen(option_class):
    assert option_class.__dataclass_params__.frozen
    assert all(field.kw_only for field in dataclasses.fields(option_class))
    with pytest.raises(TypeError, match="positional"):
        option_class(1)


@pytest.mark.parametrize("function", KEYWORD_CALLABLES, ids=lambda f: f.__name__)
def test_functions_with_many_options_take_them_by_name(function):
    parameters = inspect.signature(function).parameters.values()
    assert positional_limit(function) <= 1
    assert any(parameter.kind is inspect.Parameter.KEYWORD_ONLY for parameter in parameters)


def positional_calls(tree: ast.Module, where: str) -> list[str]:
    """`where:line name` for each call in `tree` of a class or function of LIMITS with more positional
    arguments than it takes (a `*args` counts as too many)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            starred = any(isinstance(argument, ast.Starred) for argument in node.args)
            if name in LIMITS and (len(node.args) > LIMITS[name] or starred):
                found.append(f"{where}:{node.lineno} {name}")
    return found


def test_the_check_finds_a_planted_positional_call():
    planted = "def f(engine, batcher, model):\n    validate(model, valid, tokenizers)\n    QueuedRequest(lines)\n"
    assert positional_calls(ast.parse(planted), "planted.py") == ["planted.py:2 validate", "planted.py:3 QueuedRequest"]
    assert positional_calls(ast.parse("score_pairs(engine, tokenizers=t)\nLevers(compile=True)\n"), "fine.py") == []


def test_no_option_object_is_built_positionally():
    files = [path for folder in ("mtkit", "tests", "benchmarks") for path in sorted((REPO / folder).rglob("*.py"))]
    found = [call for path in files for call in positional_calls(source_tree(path), str(path.relative_to(REPO)))]
    assert found == []
