"""The exporters' table of formats: every `ExportFormat` has an exporter, and a format without one is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

import mtkit.exporters
from mtkit.errors import MtkitError
from mtkit.exporters import EXPORTERS, export_model
from mtkit.options import ExportFormat

pytestmark = pytest.mark.usefixtures("hf_modules_cache")  # shared_fixtures.py


def test_every_export_format_has_an_exporter() -> None:
    assert set(EXPORTERS) == set(ExportFormat)


def test_a_format_without_an_exporter_is_one_line_listing_the_known(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(mtkit.exporters, "EXPORTERS", {ExportFormat.CTRANSLATE2: EXPORTERS[ExportFormat.CTRANSLATE2]})
    with pytest.raises(MtkitError, match="--format transformers: .*choose one of ctranslate2$"):
        export_model(tmp_path / "run", tmp_path / "out", export_format=ExportFormat.TRANSFORMERS)
