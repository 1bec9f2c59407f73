"""The output folder of an export: checked before anything is written, filled in a staging folder
beside it, and swapped in whole, so an interrupted export leaves the previous one intact."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mtkit.config import Config
from mtkit.decoding.ct2_engine import MANIFEST
from mtkit.errors import MtkitError

TRANSFORMERS_NOTE = "mtkit_export.json"  # what a transformers export says of where it came from
# The file each export format writes beside its model: `--force` replaces only a folder holding one.
MARKERS = (MANIFEST, TRANSFORMERS_NOTE)


def check_exportable(config: Config, model_path: Path, form: str) -> None:
    """What neither format can hold: an imported NLLB-200, M2M-100 or mBART-50 model (its language codes, fairseq's
    positions, the LayerNorm on its embeddings, unscaled embeddings), refused in one line before anything is written."""
    model = config.model
    fairseq = model.positions == "sinusoidal_fairseq" or model.embedding_norm or not model.scale_embedding
    if config.data.lang_tag == "code" or fairseq:
        raise MtkitError(
            f"{model_path}: an imported NLLB-200, M2M-100 or mBART-50 model (language codes, fairseq's positions or "
            f"embeddings) cannot be exported to {form}; translate and serve it with mtkit (mtkit translate -m {model_path})"
        )


def check_output_dir(output_dir: Path, force: bool) -> None:
    """An export may go to a new or empty folder, or replace an earlier mtkit export with `force`."""
    if output_dir.exists() and not output_dir.is_dir():
        raise MtkitError(f"{output_dir}: exists and is not a directory; choose another -o")
    if not output_dir.is_dir() or not any(output_dir.iterdir()):
        return
    if not force:
        raise MtkitError(f"{output_dir}: directory exists and is not empty; pass --force to replace it, or choose another -o")
    if not any((output_dir / marker).is_file() for marker in MARKERS):
        raise MtkitError(f"{output_dir}: holds files that are not an mtkit export; --force only replaces an earlier export")


@contextmanager
def staged(output_dir: Path) -> Iterator[Path]:
    """A staging folder beside `output_dir` to write into; it becomes `output_dir` when the block ends
    without an error (an earlier export there is replaced), and is removed when it does not."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0o700 would keep the export from other users
        yield staging
        if output_dir.exists():
            shutil.rmtree(output_dir)  # empty, or an earlier export (checked by check_output_dir)
        staging.rename(output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
