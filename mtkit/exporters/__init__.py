"""Models written for other toolkits, one module per target format (`mtkit export --format`).

Every exporter has one signature, `(model_path, output_dir, *, quantization, force) -> the folder written`;
a new format is its module, a value of `options.ExportFormat` and its row in `EXPORTERS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from mtkit.errors import MtkitError
from mtkit.exporters.ctranslate2 import export_ctranslate2
from mtkit.exporters.transformers import export_transformers
from mtkit.options import ExportFormat


class Exporter(Protocol):
    """One row's function: the model of `model_path` written into `output_dir`; returns the folder written."""

    def __call__(self, model_path: Path, output_dir: Path, *, quantization: str | None, force: bool) -> Path: ...


EXPORTERS: dict[ExportFormat, Exporter] = {
    ExportFormat.CTRANSLATE2: export_ctranslate2,
    ExportFormat.TRANSFORMERS: export_transformers,
}


def export_model(
    model_path: Path, output_dir: Path, *, export_format: ExportFormat, quantization: str | None = None, force: bool = False
) -> Path:
    """Write the model of a run directory or checkpoint in `export_format` into `output_dir`; the directory written."""
    exporter = EXPORTERS.get(export_format)
    if exporter is None:
        known, value = ", ".join(export.value for export in EXPORTERS), getattr(export_format, "value", export_format)
        raise MtkitError(f"--format {value}: not a format mtkit exports; choose one of {known}")
    return exporter(model_path, output_dir, quantization=quantization, force=force)
