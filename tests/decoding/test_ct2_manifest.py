"""A CTranslate2 export's mtkit.json as `load_export` reads it: tokenizer names are files of the export, and a
damaged manifest (bad JSON, a missing key, a wrong type) is one line naming the key, before anything is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mtkit.config import Config, config_to_dict
from mtkit.data.tokenizer import train_sentencepiece
from mtkit.decoding.ct2_engine import MANIFEST, load_export
from mtkit.errors import MtkitError

pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def spm_model() -> bytes:
    lines = [f"a man number {n} walks past {n + 1} dogs and {n * 7} cats ." for n in range(200)]
    return train_sentencepiece(lines, 60, model_type="unigram").model_proto


def _manifest() -> dict:
    config = Config()
    return {
        "tokenizers": {"src": "source.spm", "tgt": "target.spm"},
        "recipe": config_to_dict(config),
        "decode": config_to_dict(config)["decode"],
        "max_positions": 64,
        "normalize": "NFC",
        "alignment_layer": 0,
    }


def _export(folder: Path, spm_model: bytes, manifest: dict | str) -> Path:
    """A folder that looks like an export: model.bin (not a model: loading it fails after the manifest is read)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.bin").write_bytes(b"not a model")
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(spm_model)
    (folder / MANIFEST).write_text(manifest if isinstance(manifest, str) else json.dumps(manifest), encoding="utf-8")
    return folder


@pytest.mark.parametrize("name", ["/etc/hostname", "../outside.spm", "sub/source.spm", "..", "", "missing.spm"])
def test_a_tokenizer_name_outside_the_export_is_one_line(tmp_path, spm_model, name):
    (tmp_path / "outside.spm").write_bytes(spm_model)
    manifest = _manifest()
    manifest["tokenizers"]["src"] = name
    folder = _export(tmp_path / "exp", spm_model, manifest)
    (folder / "sub").mkdir()
    (folder / "sub" / "source.spm").write_bytes(spm_model)
    with pytest.raises(MtkitError, match=rf"mtkit.json: tokenizer {name!r} is not a file of this export; ") as err:
        load_export(folder)
    assert "\n" not in str(err.value)


def test_a_link_leading_out_of_the_export_is_refused(tmp_path, spm_model):
    (tmp_path / "outside.spm").write_bytes(spm_model)
    folder = _export(tmp_path / "exp", spm_model, _manifest())
    (folder / "target.spm").unlink()
    (folder / "target.spm").symlink_to(tmp_path / "outside.spm")
    with pytest.raises(MtkitError, match="tokenizer 'target.spm' is not a file of this export"):
        load_export(folder)
    (folder / "target.spm").unlink()
    (folder / "target.spm").write_bytes(spm_model)
    (folder / "target.spm.pieces.json").symlink_to(tmp_path / "outside.spm")  # the piece table read beside it
    with pytest.raises(MtkitError, match="tokenizer 'target.spm' is not a file of this export"):
        load_export(folder)


def _without(key: str) -> dict:
    manifest = _manifest()
    del manifest[key]
    return manifest


@pytest.mark.parametrize(
    ("manifest", "needle"),
    [
        ("{", "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
        ("[1, 2]", "holds list, not an object of keys"),
        (_without("tokenizers"), "'tokenizers' is missing"),
        (_without("recipe"), "'recipe' is missing"),
        (_without("max_positions"), "'max_positions' is missing"),
        ({**_manifest(), "max_positions": "64"}, "'max_positions' is \"64\", not a whole number above 0"),
        ({**_manifest(), "max_positions": True}, "'max_positions' is true"),
        ({**_manifest(), "normalize": 3}, "'normalize' is 3, not a string"),
        ({**_manifest(), "normalize": "NFD"}, "normalize"),
        ({**_manifest(), "alignment_layer": -1}, "'alignment_layer' is -1"),
        ({**_manifest(), "tokenizers": {"src": "source.spm"}}, '\'tokenizers\' is {"src": "source.spm"}'),
        ({**_manifest(), "decode": {"beam": "wide"}}, "beam"),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 60 else None,
)
def test_a_damaged_manifest_is_one_line_naming_the_key(tmp_path, spm_model, manifest, needle):
    folder = _export(tmp_path / "exp", spm_model, manifest)
    with pytest.raises(MtkitError) as err:
        load_export(folder)
    message = str(err.value)
    assert "\n" not in message and needle in message and MANIFEST in message and "CTranslate2 cannot load" not in message


def test_a_sound_manifest_reaches_ctranslate2(tmp_path, spm_model):
    folder = _export(tmp_path / "exp", spm_model, _manifest())
    with pytest.raises(MtkitError, match="CTranslate2 cannot load it"):  # model.bin is not a model: past every check
        load_export(folder, threads=torch.get_num_threads())  # as many threads as found: the fixture's check
