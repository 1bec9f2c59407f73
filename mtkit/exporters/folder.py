"""The output folder of an export: checked before anything is written, filled in a staging folder
beside it, checked again and swapped in whole, so that the earlier export or the new one is there at every
instant (an interrupted export leaves the earlier one intact, and the next export removes what it left); and
the writers of its JSON and safetensors files."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
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
from mtkit.textio import atomic_file, say, write_file

TRANSFORMERS_NOTE = "mtkit_export.json"  # what a transformers export says of where it came from
# The file each export format writes beside its model: `--force` replaces only a folder holding one.
MARKERS = (MANIFEST, TRANSFORMERS_NOTE)
STAGING, ASIDE = "staging", "old"  # the name parts of a folder being written and of an earlier export set aside
AT_FDCWD, RENAME_EXCHANGE = -100, 2  # <fcntl.h> and <linux/fs.h>: paths from the working folder; swap both
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


def check_output_dir(output_dir: Path, *, force: bool) -> frozenset[str]:
    """An export may go to a new or empty folder, or replace an earlier mtkit export with `force`; the names the
    folder holds now, which `staged` checks again just before the swap."""
    check_kind(output_dir)
    held = frozenset(os.listdir(output_dir)) if output_dir.is_dir() else frozenset()
    if not held:
        return held
    if not force:
        raise MtkitError(f"{output_dir}: directory exists and is not empty; pass --force to replace it, or choose another -o")
    if not any((output_dir / marker).is_file() for marker in MARKERS):
        raise MtkitError(f"{output_dir}: holds files that are not an mtkit export; --force only replaces an earlier export")
    return held


def check_kind(output_dir: Path) -> None:
    """-o is a folder or nothing yet; a link is refused (the swap would replace the link, not fill its target), and
    so are `.` and `..`, which have no name to stage beside."""
    if output_dir.name in ("", ".", ".."):
        raise MtkitError(f"{output_dir}: give the export's folder by its name (-o ../NAME, or -o NAME), not {output_dir}")
    if output_dir.is_symlink():
        raise MtkitError(
            f"{output_dir}: is a symbolic link (to {os.readlink(output_dir)}); give the folder itself as -o, or another -o"
        )
    if output_dir.exists() and not output_dir.is_dir():
        raise MtkitError(f"{output_dir}: exists and is not a directory; choose another -o")


@contextmanager
def staged(output_dir: Path, *, held: frozenset[str]) -> Iterator[Path]:
    """A staging folder beside `output_dir` to write into; it takes the place of `output_dir` when the block ends
    without an error, and is removed when it does not. `held`: what `check_output_dir` found in `output_dir`.

    The staging folder is locked while it is written (a lock the system drops when the process ends, even
    killed), so the leftovers of a killed export are told from a running one's and removed by the next export
    that ends."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.{STAGING}.", dir=output_dir.parent))
    lock = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        staging.chmod(0o755)  # mkdtemp's 0o700 would keep the export from other users
        yield staging
        check_kind(output_dir)  # again, as everything below: a file or link put there since the first check
        check_unchanged(output_dir, held)
        swap_in(staging, output_dir)
        remove_leftovers(output_dir)  # once the new export is in place: an earlier one set aside may be all there was
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.close(lock)


def check_unchanged(output_dir: Path, held: frozenset[str]) -> None:
    """Files that appeared in `output_dir` since the export checked it are never replaced silently."""
    added = sorted(set(os.listdir(output_dir) if output_dir.is_dir() else ()) - held)
    if added:
        raise MtkitError(
            f"{output_dir}: {', '.join(added[:3])}{' ...' if len(added) > 3 else ''} appeared there while exporting, "
            "so nothing was replaced; move them away (or choose another -o) and export again"
        )


def swap_in(staging: Path, output_dir: Path) -> None:
    """`staging` becomes `output_dir`: exchanged with an earlier export in one step where the system allows it
    (Linux's renameat2), else the earlier one renamed aside first; it is deleted once the new one is in place."""
    try:
        if not output_dir.is_dir() or not os.listdir(output_dir):
            staging.rename(output_dir)  # onto nothing, or onto an empty folder: one step
            return
        if exchange(staging, output_dir):
            shutil.rmtree(staging, ignore_errors=True)  # the earlier export, now under the staging name
            return
        aside = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.{ASIDE}.", dir=output_dir.parent))
        output_dir.rename(aside)  # onto the empty folder just made
        try:
            staging.rename(output_dir)
        except OSError:
            aside.rename(output_dir)
            raise
        shutil.rmtree(aside, ignore_errors=True)
    except OSError as err:
        raise MtkitError(
            f"{output_dir}: cannot put the export in place ({err.strerror}); the earlier one is left as it was"
        ) from None


def exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step (renameat2 with RENAME_EXCHANGE); False where the C library or the file system
    has no such call, and the caller renames in two steps."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(AT_FDCWD, os.fsencode(first), AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


def remove_leftovers(output_dir: Path) -> None:
    """Remove, and say so, what an export killed before it ended left beside `output_dir`: its staging folder or
    the earlier export it had set aside (mtkit's own names, `.NAME.staging.XXXXXXXX`, `.NAME.old.XXXXXXXX`), or a
    finished export under the staging name of mtkit before those (`.NAME.XXXXXXXX`, with an export's marker file).
    A folder that a running export holds is left alone."""
    names = re.compile(rf"\.{re.escape(output_dir.name)}\.(?:({STAGING}|{ASIDE})\.)?[a-z0-9_]{{8}}")
    for entry in sorted(output_dir.parent.iterdir()):
        found = names.fullmatch(entry.name)
        if found is None or entry.is_symlink() or not entry.is_dir():
            continue
        if (found.group(1) or any((entry / marker).is_file() for marker in MARKERS)) and not in_use(entry):
            shutil.rmtree(entry, ignore_errors=True)
            say(f"mtkit: removed {entry}, left by an export to {output_dir} that was stopped before it ended")


def in_use(folder: Path) -> bool:
    """Whether a running export holds `folder`'s lock (or the lock cannot be tried: then it is left alone too)."""
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return True
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(handle)
    return False


def write_json(path: Path, data: dict[str, Any]) -> None:
    """A JSON file as transformers writes them: indented, UTF-8 unescaped."""
    write_file(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """A .safetensors file (the layout the `safetensors` library reads): header size, JSON header, raw tensors."""
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
