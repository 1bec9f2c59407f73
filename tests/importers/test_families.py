"""The importers' table of families: `mtkit import auto` reads the family from config.json, and a family or
model_type mtkit does not know is one line listing the known ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from marian_builder import Variant, build_marian
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.errors import MtkitError
from mtkit.importers import FAMILIES, import_model
from mtkit.importers.loader import family_of
from mtkit.models.checkpoint import read_checkpoint

pytestmark = [
    pytest.mark.usefixtures("transformers_installed"),  # shared_fixtures.py
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]


def test_auto_imports_what_the_named_family_imports(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    build_marian(folder, Variant())
    runner = CliRunner()
    named = runner.invoke(app, ["import", "marian", str(folder), "-o", str(tmp_path / "named")])
    auto = runner.invoke(app, ["import", "auto", str(folder), "-o", str(tmp_path / "auto")])
    assert named.exit_code == 0 and auto.exit_code == 0, named.output + auto.output
    assert auto.output.replace(str(tmp_path / "auto"), str(tmp_path / "named")) == named.output
    expected, found = (read_checkpoint(tmp_path / run / "best.pt")["model"] for run in ("named", "auto"))
    assert expected.keys() == found.keys() and all(torch.equal(expected[key], found[key]) for key in expected)


def test_a_model_type_without_a_family_is_one_line_listing_the_known(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    build_marian(folder, Variant())
    settings = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**settings, "model_type": "t5"}))
    with pytest.raises(MtkitError, match=r"model_type 't5'.*marian \(marian\)") as raised:
        import_model(str(folder), tmp_path / "run")
    assert "\n" not in str(raised.value)
    where = folder / "config.json"  # without model_type, the architectures name the family
    assert family_of({"architectures": ["MarianMTModel"]}, where, families=FAMILIES) is FAMILIES["marian"]
    with pytest.raises(MtkitError, match=r"architectures \['T5Model'\].*marian"):
        family_of({"architectures": ["T5Model"]}, where, families=FAMILIES)


def test_an_unknown_family_is_one_line_listing_the_known(tmp_path: Path) -> None:
    with pytest.raises(MtkitError, match="choose one of marian, m2m100, mbart, auto") as raised:
        import_model("somewhere", tmp_path / "run", family="t5")
    assert "\n" not in str(raised.value) and list(FAMILIES) == ["marian", "m2m100", "mbart"]
