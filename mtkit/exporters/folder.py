"""The output folder of an export: checked before anything is written, filled in a staging folder
beside it, and swapped in whole, so an interrupted export leaves the previous one intact; and the writers of
its JSON and safetensors files."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from mtkit.config import Config
from mtkit.decoding.ct2_engine import MANIFEST
from mtkit.errors import MtkitError
from mtkit.importers.names import SAFETENSORS_DTYPES
from mtkit.textio import atomic_file, write_file

TRANSFORMERS_NOTE = "mtkit_export.json"  # what a transformers export says of where it came from
# The file each export format writes beside its model: `--force` replaces only a folder holding one.
MARKERS = (MANIFEST, TRANSFORMERS_NOTE)
MAX_LENGTH = 512  # generate's default cap (tokens, BOS included); mtkit's own cap depends on each source's length


def check_exportable(config: Config, model_path: Path, *, form: str) -> None:
    """What a MarianMTModel or mtkit's own modeling code cannot hold (fairseq's positions, the LayerNorm on the
    embeddings, unscaled embeddings), outside an imported NLLB-200, M2M-100 or mBART-50 run, which goes to its own
    class; refused in one line before anything is written."""
    model = config.model
    if model.positions == "sinusoidal_fairseq" or model.embedding_norm or not model.scale_embedding:
        raise MtkitError(
            f"{model_path}: model.positions {model.positions}, embedding_norm {model.embedding_norm} or scale_embedding "
            f"{model.scale_embedding} cannot be exported to {form} without the language codes of an imported "
            f"NLLB-200, M2M-100 or mBART-50 model; export with --format ctranslate2 or translate with mtkit "
            f"(mtkit translate -m {model_path})"
        )


def check_output_dir(output_dir: Path, *, force: bool) -> None:
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    """A JSON file as transformers writes them: indented, UTF-8 unescaped."""
    write_file(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """A .safetensors file (the layout `read_safetensors` reads): header size, JSON header, raw tensors."""
    names = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset, blobs = 0, []
    for name, tensor in sorted(tensors.items()):
        blob = tensor.detach().cpu().contiguous().numpy().tobytes()
        header[name] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with atomic_file(path, binary=True) as file:
        file.write(len(encoded).to_bytes(8, "little") + encoded)
        for blob in blobs:
            file.write(blob)
