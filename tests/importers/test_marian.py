"""`mtkit import marian` from the command line: a tiny Marian folder imported and used, and what it refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import cli_output
from marian_builder import Variant, build_marian

from mtkit.cli import app
from mtkit.errors import MtkitError
from mtkit.importers.marian import import_marian

pytestmark = [
    pytest.mark.usefixtures("transformers_installed"),  # shared_fixtures.py
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]


@pytest.fixture(scope="module")
def marian_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Marian folder, built once for the module (each test changes a copy of its own)."""
    folder = tmp_path_factory.mktemp("marian") / "model"
    build_marian(folder, Variant())
    return folder


def copy_of(folder: Path, tmp_path: Path, name: str = "model") -> Path:
    return Path(shutil.copytree(folder, tmp_path / name))


def test_the_cli_imports_a_folder_and_translates_with_it(marian_folder: Path, tmp_path: Path) -> None:
    folder = copy_of(marian_folder, tmp_path, "opus-mt-en-fr")
    said = cli_output("import", "marian", str(folder), "-o", str(tmp_path / "run"))
    assert "imported" in said and "en->fr" in said
    (tmp_path / "in.txt").write_text("A dog runs.\n\nTwo men.\n", encoding="utf-8")
    cli_output("translate", "-m", str(tmp_path / "run"), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.txt"))
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == 3


def _refusal(tmp_path: Path, *arguments: str) -> str:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["import", "marian", *arguments])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtkit: error:")
    return lines[0]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("normalize_before", True),
        ("scale_embedding", False),
        ("activation_function", "gelu_new"),
        ("model_type", "bart"),
        ("eos_token_id", 10**6),
    ],
)
def test_what_mtkit_cannot_represent_is_refused_by_its_config_key(
    marian_folder: Path, tmp_path: Path, key: str, value: object
) -> None:
    folder = copy_of(marian_folder, tmp_path)
    settings = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**settings, key: value}))
    assert key in _refusal(tmp_path, str(folder), "-o", str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_missing_files_a_busy_output_and_an_unreachable_hub_are_one_line(marian_folder: Path, tmp_path: Path) -> None:
    folder = copy_of(marian_folder, tmp_path)
    (folder / "vocab.json").rename(folder / "elsewhere.json")
    assert "vocab.json" in _refusal(tmp_path, str(folder), "-o", str(tmp_path / "run"))
    (folder / "elsewhere.json").rename(folder / "vocab.json")
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    assert "model.safetensors" in _refusal(tmp_path, str(folder), "-o", str(tmp_path / "run"))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert "busy" in _refusal(tmp_path, str(folder), "-o", str(tmp_path / "busy"))
    line = _refusal(tmp_path, "Helsinki-NLP/opus-mt-no-such-pair", "-o", str(tmp_path / "run"))
    assert "Helsinki-NLP/opus-mt-no-such-pair" in line and "folder" in line
    with pytest.raises(MtkitError, match="not a folder"):
        import_marian(str(folder / "config.json"), tmp_path / "run")
