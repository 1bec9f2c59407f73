"""The one file writer: every file mtkit writes is replaced whole, with the mode the umask gives a new file; and the
one YAML reader."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
import yaml

from mtkit.config import Config
from mtkit.distributed import Distributed
from mtkit.errors import MtkitError
from mtkit.evaluation.metrics import score_corpus
from mtkit.evaluation.report import save_scores
from mtkit.models.checkpoint import save_checkpoint
from mtkit.textio import SAFE_LOADER, atomic_file, atomic_output, loaded_while_unchanged, parse_yaml, say, write_file, write_lines
from mtkit.training.run_writer import RunWriter


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_checkpoint_an_output_a_config_and_a_report_are_0644_with_no_temporary_file_left(tmp_path, umask_022):
    save_checkpoint({"weights": torch.zeros(2)}, tmp_path / "run" / "best.pt")
    write_lines(["eine Zeile", "two\nlines"], tmp_path / "out.txt")
    run_dir = RunWriter(tmp_path / "run", overwrite=True)
    run_dir.write_config(Config(name="umask"))
    run_dir.close()
    save_scores(tmp_path / "run", "test", result=score_corpus(["a b c"], [["a b c"]]))
    run = tmp_path / "run"
    written = [run / "best.pt", tmp_path / "out.txt", run / "config.yaml", run / "scores.json"]
    assert {path.name: mode(path) for path in written} == {path.name: 0o644 for path in written}
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "eine Zeile\ntwo lines\n"
    leftovers = [path.name for path in tmp_path.rglob("*") if path.name.endswith(".tmp")]
    assert not leftovers


def test_the_mode_follows_the_umask(tmp_path):
    previous = os.umask(0o077)
    try:
        write_file(tmp_path / "private.txt", "secret\n")
    finally:
        os.umask(previous)
    assert mode(tmp_path / "private.txt") == 0o600


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "report.json"
    write_file(target, "old\n")
    with pytest.raises(RuntimeError), atomic_file(target) as file:
        file.write("half of the new")
        raise RuntimeError("interrupted")
    assert target.read_text(encoding="utf-8") == "old\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["report.json"]


def test_binary_content_is_written_as_given(tmp_path):
    write_file(tmp_path / "model.spm", b"\x00\x01\xff")
    assert (tmp_path / "model.spm").read_bytes() == b"\x00\x01\xff"


def test_a_directory_that_cannot_be_written_is_one_error_naming_the_file(tmp_path):
    missing = tmp_path / "no" / "such" / "dir" / "out.txt"
    with pytest.raises(MtkitError, match=r"out\.txt: cannot write .*check the directory exists"):
        write_file(missing, "x")


def test_standard_output_is_used_when_no_path_is_given(capsys):
    with atomic_output(None) as out:
        out.write("to stdout\n")
    assert capsys.readouterr().out == "to stdout\n"


def test_say_writes_a_status_line_on_stderr_from_the_main_rank_only(capsys):
    say("one")
    say("two", distributed=Distributed(rank=0, world_size=2))
    say("three", distributed=Distributed(rank=1, world_size=2))
    captured = capsys.readouterr()
    assert captured.err == "one\ntwo\n" and captured.out == ""


def test_yaml_is_read_by_libyaml_where_pyyaml_has_it_with_safe_loads_values_and_errors():
    assert (SAFE_LOADER is yaml.CSafeLoader) == yaml.__with_libyaml__
    for path in sorted((Path(__file__).resolve().parents[1] / "recipes").rglob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        assert parse_yaml(text) == yaml.safe_load(text), path
    assert parse_yaml("lr: 3e-4\nsteps: 0x10\nname: ~\non: yes") == {"lr": "3e-4", "steps": 16, "name": None, True: True}
    for bad in ("a: [1, 2", "a: b: c", "!!python/object/apply:os.system ['true']", "a: \x00"):
        with pytest.raises(yaml.YAMLError):
            parse_yaml(bad)


@pytest.mark.parametrize("value", ["1" * 5000, "!!bool maybe", "!!timestamp 99999-01-01"], ids=["digits", "bool", "date"])
def test_a_value_yaml_cannot_build_is_a_yaml_error_like_any_other(value):
    """Python's own errors from PyYAML's constructors (its 4,300-digit limit on integers, ...) are YAML errors too,
    so each caller's `except yaml.YAMLError` names the file in one line."""
    with pytest.raises(yaml.YAMLError, match="a value YAML cannot build"):
        parse_yaml(f"a: {value}")


def test_a_file_beside_a_model_is_read_once_until_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "priors.txt"
    path.write_text("one")
    reads: list[str] = []

    def load(where: Path) -> str:
        reads.append(where.read_text())
        return reads[-1]

    assert loaded_while_unchanged(path, load) == loaded_while_unchanged(path, load) == "one"
    path.write_text("three")  # another size: read again
    assert loaded_while_unchanged(path, load) == "three"
    assert reads == ["one", "three"]
