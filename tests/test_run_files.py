"""RunFiles is the one owner of a run directory's file names: nothing else in mtkit/ spells them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import source_tree

from mtkit.errors import MtkitError
from mtkit.run_files import RunFiles, checkpoint_file

PACKAGE = Path(__file__).resolve().parents[1] / "mtkit"
NAMES = {"config.yaml", "last.pt", "best.pt", "ema.pt", "average.pt", "log.jsonl", "curves.png", "scores.json", "train.lock"}


def _joined_names(tree: ast.AST) -> list[str]:
    """The run directory names joined onto a path (`path / "best.pt"`) or globbed (`glob("step_*.pt")`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
            if node.right.value in NAMES or str(node.right.value).startswith(("step_", "at_")):
                found.append(node.right.value)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "glob":
            found += [arg.value for arg in node.args if isinstance(arg, ast.Constant) and str(arg.value).endswith(".pt")]
    return found


def test_no_module_but_run_files_names_a_run_directorys_files():
    spelled = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "run_files.py":
            names = _joined_names(source_tree(path))
            if names:
                spelled[str(path.relative_to(PACKAGE))] = names
    assert not spelled, f"use mtkit.run_files.RunFiles for these: {spelled}"


def test_the_walk_finds_a_name_joined_by_hand():
    assert _joined_names(ast.parse('run / "best.pt"; run.glob("step_*.pt")')) == ["best.pt", "step_*.pt"]


def test_a_checkpoint_file_stands_for_its_run_directory(tmp_path):
    assert RunFiles.of(tmp_path / "best.pt").path == tmp_path
    assert RunFiles.of(tmp_path).best == tmp_path / "best.pt"
    assert RunFiles(tmp_path).step(12).name == "step_00000012.pt"


def test_training_outputs_are_what_overwrite_clears_and_keep_the_config(tmp_path):
    files = RunFiles(tmp_path)
    for path in (files.step(2), files.step(10), files.snapshot("15m"), files.best, files.config, files.scores):
        path.write_text("x")
    outputs = files.training_outputs()
    assert outputs[:3] == [files.step(2), files.step(10), files.snapshot("15m")]
    assert files.best in outputs and files.config not in outputs and files.scores not in outputs


def test_scores_round_trip_and_an_unreadable_file_counts_as_none(tmp_path):
    files = RunFiles(tmp_path)
    assert files.read_scores() is None
    files.write_scores({"test": {"BLEU": 37.1}})
    assert files.read_scores() == {"test": {"BLEU": 37.1}}
    files.scores.write_text("{not json")
    assert files.read_scores() is None


def test_a_run_directory_means_its_best_validated_final_weights(tmp_path):
    files, bleu = RunFiles(tmp_path), {}
    with pytest.raises(MtkitError, match=r"no best.pt or last.pt in this run directory; train a model"):
        files.chosen_weights(bleu.get)
    files.last.write_text("x")
    assert files.chosen_weights(bleu.get) == files.last  # nothing validated yet
    files.best.write_text("x")

    def unread(path):
        raise AssertionError(f"{path.name}'s score was read with nothing to compare it with")

    assert files.chosen_weights(unread) == files.best  # no EMA or average: no checkpoint is read for its score
    bleu[files.best] = 30.0
    for path in (files.ema, files.average):
        path.write_text("x")
    assert files.chosen_weights(bleu.get) == files.best  # an EMA and an average not validated yet (no BLEU)
    bleu[files.ema] = 30.0
    assert files.chosen_weights(bleu.get) == files.ema  # a tie goes to an average
    bleu[files.average] = 30.0
    assert files.chosen_weights(bleu.get) == files.average
    bleu[files.ema] = 31.0
    assert files.chosen_weights(bleu.get) == files.ema


def test_a_checkpoint_file_means_itself(tmp_path):
    (tmp_path / "run").mkdir()
    RunFiles(tmp_path / "run").last.write_text("x")
    assert checkpoint_file(tmp_path / "run", {}.get) == RunFiles(tmp_path / "run").last
    assert checkpoint_file(RunFiles(tmp_path / "run").last, {}.get) == RunFiles(tmp_path / "run").last
    with pytest.raises(MtkitError, match="no such run directory or checkpoint"):
        checkpoint_file(tmp_path / "nowhere", {}.get)
