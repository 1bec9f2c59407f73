"""`mtkit import marian` from the command line: a tiny Marian folder imported and used, and what it refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import cli_output
from marian_builder import Variant, build_marian

from mtkit.cli import app
from mtkit.data.tokenizer import EOS_ID, PAD_ID
from mtkit.errors import MtkitError
from mtkit.importers.marian import import_marian
from mtkit.models.checkpoint import read_checkpoint

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


def test_the_generation_settings_an_export_keeps_are_recorded_in_mtkits_ids(marian_folder: Path, tmp_path: Path) -> None:
    folder = copy_of(marian_folder, tmp_path)
    settings = json.loads((folder / "config.json").read_text())
    eos, pad = settings["eos_token_id"], settings["pad_token_id"]
    generation = {"forced_eos_token_id": eos, "bad_words_ids": [[pad], [eos, pad]], "max_length": 30, "top_k": 7}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    import_marian(str(folder), tmp_path / "run")
    kept = read_checkpoint(tmp_path / "run" / "best.pt")["generation"]
    assert kept == {"forced_eos_token_id": EOS_ID, "bad_words_ids": [[PAD_ID], [EOS_ID, PAD_ID]], "max_length": 30}


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("forced_eos_token_id", 10**6, "is not an id (or a list of ids) of the target vocabulary's"),
        ("forced_eos_token_id", "</s>", "is not an id"),
        ("bad_words_ids", [5], "is not a list of lists of ids"),
        ("bad_words_ids", [[1, True]], "is not a list of lists of ids"),
        ("max_length", 0, "is not a whole number above 0"),
        ("renormalize_logits", "yes", "is not true or false"),
    ],
)
def test_a_generation_setting_an_export_could_not_write_is_refused_by_its_key(
    marian_folder: Path, tmp_path: Path, key: str, value: object, needle: str
) -> None:
    folder = copy_of(marian_folder, tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({key: value}))
    line = _refusal(tmp_path, str(folder), "-o", str(tmp_path / "run"))
    assert f"generation_config.json: {key}={json.dumps(value)} {needle}" in line and "leave it out" in line
    assert not (tmp_path / "run").exists()
