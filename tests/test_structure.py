"""How the code reads: short functions and classes, and few calls from a command to the model."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.models import Transformer

PACKAGE = Path(__file__).resolve().parents[1] / "mtkit"
LONGEST_FUNCTION, LONGEST_CLASS = 50, 200


def definitions() -> list[tuple[str, ast.AST]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}", node))
    return found


def test_no_function_is_longer_than_50_lines_and_no_class_longer_than_200():
    too_long = [
        f"{where} ({node.end_lineno - node.lineno + 1} lines)"
        for where, node in definitions()
        if node.end_lineno - node.lineno + 1 > (LONGEST_CLASS if isinstance(node, ast.ClassDef) else LONGEST_FUNCTION)
    ]
    assert not too_long


def calls_between(command: str, frames: list[inspect.FrameInfo], target: str | None = None) -> int:
    """How many calls lead from the CLI command `command` to `target` (1: the command calls it).

    `frames` is a stack recorded inside a patched function; without `target`, that function is the
    target. Frames outside mtkit (torch's module call wrappers, the CLI framework, the recording
    wrapper) are not counted.
    """
    ours = [frame for frame in frames if Path(frame.filename).resolve().is_relative_to(PACKAGE)]  # innermost first
    outer = next(i for i, frame in enumerate(ours) if frame.function == command and frame.filename.endswith("cli.py"))
    if target is None:
        return outer + 1
    return outer - next(i for i, frame in enumerate(ours) if frame.function == target)


@pytest.fixture
def recorded_stacks(monkeypatch) -> dict[str, list[inspect.FrameInfo]]:
    """The call stack at the model's first forward pass (Transformer.encode) and at the first beam step."""
    from mtkit import search

    stacks: dict[str, list[inspect.FrameInfo]] = {}
    encode, advance = Transformer.encode, search._advance_beams

    def recording_encode(self, *args):
        stacks.setdefault("encode", inspect.stack())
        return encode(self, *args)

    def recording_advance(*args):
        stacks.setdefault("beam step", inspect.stack())
        return advance(*args)

    monkeypatch.setattr(Transformer, "encode", recording_encode)
    monkeypatch.setattr(search, "_advance_beams", recording_advance)
    return stacks


def test_translate_reaches_the_model_and_the_beam_step_in_at_most_four_calls(reverse_run, recorded_stacks):
    result = CliRunner().invoke(app, ["translate", "-m", str(reverse_run.run_path), "--beam", "2"], input="a b c\n")
    assert result.exit_code == 0, result.output
    # translate -> translate_file -> engine.search -> beam_search -> encode / _advance_beams
    assert calls_between("translate", recorded_stacks["encode"]) <= 4
    assert calls_between("translate", recorded_stacks["beam step"]) <= 4


def test_train_reaches_the_model_forward_in_at_most_four_calls(tmp_path, recorded_stacks):
    from conftest import prepared_reverse_task

    from mtkit.config import config_to_dict

    config = prepared_reverse_task(tmp_path, max_steps=1, validate_every=1)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(config_to_dict(config)), encoding="utf-8")
    result = CliRunner().invoke(app, ["train", str(recipe)])
    assert result.exit_code == 0, result.output
    # train -> train() -> Trainer.run -> Trainer.update -> EncoderDecoder.forward
    assert calls_between("train", recorded_stacks["encode"], target="forward") <= 4
