"""Models written for other toolkits, one module per target format (`mtkit export --format`)."""

from __future__ import annotations

from pathlib import Path

from mtkit.errors import OptionError
from mtkit.exporters.ctranslate2 import export_ctranslate2
from mtkit.exporters.transformers import export_transformers
from mtkit.options import ExportFormat


def export_model(
    model_path: Path, output_dir: Path, *, export_format: ExportFormat, quantization: str | None = None, force: bool = False
) -> Path:
    """Write the model of a run directory or checkpoint in `export_format` into `output_dir`; the directory written."""
    if export_format is ExportFormat.CTRANSLATE2:
        return export_ctranslate2(model_path, output_dir, quantization, force=force)
    if quantization is not None:
        raise OptionError(
            "quantization",
            "{quantization} {value}: CTranslate2's weight types; a transformers export keeps float32",
            value=quantization,
        )
    if export_format is ExportFormat.TRANSFORMERS:
        return export_transformers(model_path, output_dir, force=force)
    raise ValueError(f"no exporter for {export_format}")  # every ExportFormat has a branch above
