"""Every file an import reads, drawn hostile (tiny Marian, NLLB-200 and M2M-100 folders, one file changed per
example: a key set to any JSON value or removed, the whole file replaced by other JSON or bytes, a SentencePiece
model cut short, a safetensors header's entries changed): the import succeeds or raises one one-line MtkitError,
never another exception, and not the one by which `import_family` turns an unforeseen error into one line (each
malformed input has a check of its own that names it). Derandomised under CI=true."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from fairseq_builder import build
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from marian_builder import Variant, build_marian

from mtkit.errors import MtkitError
from mtkit.importers import import_model

pytestmark = [
    pytest.mark.usefixtures("transformers_installed"),  # shared_fixtures.py
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]
CI = os.environ.get("CI") == "true"
FUZZ = settings(max_examples=40 if CI else 15, derandomize=CI, deadline=None, suppress_health_check=list(HealthCheck))

NUMBERS = st.sampled_from([0, 1, -1, 2, 3, 4, 8, 16, 32, 64, 174, 10**6, 10**12, 2**63, 2.5, float("inf"), float("nan")])
SCALARS = st.none() | st.booleans() | NUMBERS | st.integers() | st.floats() | st.text(max_size=12)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
)
DTYPES = st.sampled_from(["F32", "F16", "BF16", "F64", "I64", "U8", "BOOL", "F8_E4M3", "X"])
SHAPES = st.lists(NUMBERS.filter(lambda n: isinstance(n, int)) | st.integers(0, 400), max_size=3) | VALUES
# every file a family's import reads (the weights' header, its JSON files, its SentencePiece models)
FILES = {
    "marian": ["config.json", "generation_config.json", "tokenizer_config.json", "vocab.json", "model.safetensors", "source.spm"],
    "nllb": ["config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json", "model.safetensors",
             "sentencepiece.bpe.model"],
    "m2m100": ["vocab.json", "tokenizer_config.json"],
}  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    build_marian(root / "marian", Variant())
    for family in ("nllb", "m2m100"):
        build(family, root / family)
    return {family: root / family for family in FILES}


def _changed_json(data: object, draw: st.DataObject) -> bytes:
    """The JSON file with one key (at the top or one level down) set to any value or removed, or all of it replaced."""
    how = draw.draw(st.sampled_from(["set", "remove", "replace", "bytes"]))
    if how == "bytes":
        return draw.draw(st.binary(max_size=64))
    if how == "replace" or not isinstance(data, dict) or not data:
        return json.dumps(draw.draw(VALUES)).encode()
    target, key = data, draw.draw(st.sampled_from(sorted(data)))
    if isinstance(data[key], dict) and data[key] and draw.draw(st.booleans()):  # one level down (tokenizer.json's model)
        target, key = data[key], draw.draw(st.sampled_from(sorted(data[key])))
    if how == "remove":
        del target[key]
    else:
        target[key] = draw.draw(VALUES | NUMBERS)
    return json.dumps(data).encode()


def _changed_header(raw: bytes, draw: st.DataObject) -> bytes:
    """The safetensors file with one header entry's dtype, shape or offsets changed, the entry removed, or the header
    size changed; the tensors' bytes as they were."""
    (size,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8 : 8 + size]), raw[8 + size :]
    if draw.draw(st.integers(0, 9)) == 0:
        return struct.pack("<Q", draw.draw(st.integers(0, 2**64 - 1))) + raw[8:]
    name = draw.draw(st.sampled_from(sorted(header)))
    field = draw.draw(st.sampled_from(["dtype", "shape", "data_offsets", "remove", "entry"]))
    if field == "remove":
        del header[name]
    elif field == "entry":
        header[name] = draw.draw(VALUES)
    else:
        header[name][field] = draw.draw({"dtype": DTYPES, "shape": SHAPES, "data_offsets": SHAPES}[field])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _changed(path: Path, draw: st.DataObject) -> bytes:
    raw = path.read_bytes()
    if path.suffix == ".safetensors":
        return _changed_header(raw, draw)
    if path.suffix in (".spm", ".model"):  # a SentencePiece model cut short, or other bytes
        return draw.draw(st.sampled_from([raw[: draw.draw(st.integers(0, len(raw) - 1))], draw.draw(st.binary(max_size=64))]))
    return _changed_json(json.loads(raw), draw)


@pytest.mark.parametrize(("family", "name"), [(family, name) for family, names in FILES.items() for name in names])
@FUZZ
@given(draw=st.data())
def test_a_hostile_import_file_is_imported_or_refused_in_one_line(
    folders: dict[str, Path], family: str, name: str, draw: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(shutil.copytree(folders[family], Path(scratch) / "model"))
        (folder / name).write_bytes(_changed(folder / name, draw))
        try:
            import_model(str(folder), Path(scratch) / "run")
        except MtkitError as err:
            assert "\n" not in str(err), str(err)
            assert "model mtkit can read (" not in str(err), f"only the importer's last resort caught it: {err}"
