"""Few calls from a command to the model: `translate` reaches the engine's search, and `train` the model's
forward pass, in a few hops (recorded on a real run)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml
from helpers import prepared_reverse_task
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.decoding.engine import PyTorchEngine
from mtkit.models.transformer import Transformer

PACKAGE = Path(__file__).resolve().parents[2] / "mtkit"
# the most calls from a CLI command to where it acts (docs/development.md states these numbers)
TRANSLATE_TO_SEARCH_CALLS, TRAIN_TO_FORWARD_CALLS = 4, 5


def calls_between(command: str, frames: list[inspect.FrameInfo], target: str | None = None) -> int:
    """How many calls lead from the CLI command `command` to `target` (1: the command calls it).

    `frames` is a stack recorded inside a patched function; without `target`, that function is the
    target. Frames outside mtkit (torch's module call wrappers, the CLI framework, the recording
    wrapper) are not counted.
    """
    ours = [frame for frame in frames if Path(frame.filename).resolve().is_relative_to(PACKAGE)]  # innermost first
    function = f"{command}_command"  # cli.py's function for the command
    outer = next(i for i, frame in enumerate(ours) if frame.function == function and frame.filename.endswith("cli.py"))
    if target is None:
        return outer + 1
    return outer - next(i for i, frame in enumerate(ours) if frame.function == target)


@pytest.fixture
def recorded_stacks(monkeypatch) -> dict[str, list[inspect.FrameInfo]]:
    """The call stack at the model's first forward pass (Transformer.encode) and at the engine's first search."""
    stacks: dict[str, list[inspect.FrameInfo]] = {}
    encode, search = Transformer.encode, PyTorchEngine.search

    def recording_encode(self, *args, **options):
        stacks.setdefault("encode", inspect.stack())
        return encode(self, *args, **options)

    def recording_search(self, *args, **options):
        stacks.setdefault("engine search", inspect.stack())
        return search(self, *args, **options)

    monkeypatch.setattr(Transformer, "encode", recording_encode)
    monkeypatch.setattr(PyTorchEngine, "search", recording_search)
    return stacks


def test_translate_reaches_the_engine_search_in_at_most_four_calls(reverse_run, recorded_stacks):
    result = CliRunner().invoke(app, ["translate", "-m", str(reverse_run.run_path), "--beam", "2"], input="a b c\n")
    assert result.exit_code == 0, result.output
    # translate -> translate_file -> Translator.search -> PyTorchEngine.search
    assert calls_between("translate", recorded_stacks["engine search"]) <= TRANSLATE_TO_SEARCH_CALLS


@pytest.mark.slow
def test_train_reaches_the_model_forward_in_at_most_five_calls_through_the_loss_module(tmp_path, recorded_stacks):
    from mtkit.config import config_to_dict

    config = prepared_reverse_task(tmp_path, max_steps=1, validate_every=1)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(config_to_dict(config)), encoding="utf-8")
    result = CliRunner().invoke(app, ["train", str(recipe)])
    assert result.exit_code == 0, result.output
    # train -> train() -> Trainer.run -> Trainer.update -> TeacherForcing.forward (the step's module: the forward
    # pass and the loss, which compile and DDP take as one) -> EncoderDecoder.forward
    stack = recorded_stacks["encode"]
    assert calls_between("train", stack, target="forward") <= TRAIN_TO_FORWARD_CALLS
    ours = [frame for frame in stack if Path(frame.filename).resolve().is_relative_to(PACKAGE)]  # innermost first
    callers = [(frame.function, type(frame.frame.f_locals.get("self")).__name__) for frame in ours[:3]]
    assert callers == [("forward", "Transformer"), ("forward", "TeacherForcing"), ("update", "Trainer")]
