"""`mtkit import` of malformed folders (tiny Marian and NLLB-200 folders, each changed in one way): every malformed
input the review listed, a special file standing in as JSON, sizes that do not fit the weights, an imported config
the recipe rules refuse and an absurd beam, and a best.pt whose weights do not fit its config. Each is one
`mtkit: error:` line naming the file and the key, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from fairseq_builder import build
from helpers import assert_one_line_error, invoke
from marian_builder import Variant, build_marian
from safetensors.torch import load_file, save_file

from mtkit.config import Config, DecodeConfig
from mtkit.data.tokenizer import TokenizerPair
from mtkit.errors import MtkitError
from mtkit.importers.loader import imported_model
from mtkit.models.checkpoint import read_checkpoint, save_checkpoint

pytestmark = [
    pytest.mark.usefixtures("transformers_installed"),  # shared_fixtures.py
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Marian folder and a tiny NLLB-200 folder, built once for the module (each test changes a copy)."""
    root = tmp_path_factory.mktemp("models")
    build_marian(root / "marian", Variant())
    build("nllb", root / "nllb")
    return {"marian": root / "marian", "nllb": root / "nllb"}


def _json(path: Path, change: Callable[[dict], object]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def _weights(folder: Path, change: Callable[[dict], object]) -> None:
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors")


def _pickled(folder: Path, saved: object) -> None:
    (folder / "model.safetensors").unlink()
    torch.save(saved, folder / "pytorch_model.bin")


def _set(name: str, **values: object) -> Callable[[Path], None]:
    return lambda folder: _json(folder / name, lambda data: data.update(values))


def _drop(name: str, key: str) -> Callable[[Path], None]:
    return lambda folder: _json(folder / name, lambda data: data.pop(key))


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_bytes(data)


def _special(name: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda folder: ((folder / name).unlink(), make(folder / name))


def _longer_vocab(folder: Path) -> None:
    _json(folder / "vocab.json", lambda vocab: vocab.update({f"x{i}": len(vocab) + i for i in range(9)}))


def _short_bias(folder: Path) -> None:
    _weights(folder, lambda tensors: tensors.update(final_logits_bias=tensors["final_logits_bias"][:, :5]))


def _added_token_without_id(folder: Path) -> None:
    _json(folder / "tokenizer.json", lambda tokenizer: tokenizer["added_tokens"][0].pop("id"))


DEEP = ('{"a": ' * 50_000 + "1" + "}" * 50_000).encode()
MALFORMED = [  # the review's eleven inputs (the last, a best.pt, has a test of its own) and more: (folder, change, named)
    pytest.param(
        "marian", _write("model.safetensors", b"\x02\0\0\0\0\0\0\0[]"), ["model.safetensors"], id="header not an object"
    ),
    pytest.param("marian", lambda f: _pickled(f, [torch.ones(2)]), ["pytorch_model.bin", "state dict"], id="bin holding a list"),
    pytest.param("marian", lambda f: _pickled(f, {"a": 1}), ["pytorch_model.bin", "state dict"], id="bin with a number"),
    pytest.param(
        "marian", _set("config.json", d_model=float("inf")), ["config.json", "d_model is Infinity"], id="d_model Infinity"
    ),
    pytest.param("nllb", _set("config.json", vocab_size="x"), ["config.json", 'vocab_size is "x"'], id="vocab_size text"),
    pytest.param("nllb", _set("config.json", vocab_size=None), ["config.json", "vocab_size is missing"], id="vocab_size null"),
    pytest.param("marian", _drop("config.json", "pad_token_id"), ["config.json", "pad_token_id is missing"], id="no pad id"),
    pytest.param("marian", _drop("config.json", "eos_token_id"), ["config.json", "eos_token_id is missing"], id="no eos id"),
    pytest.param("marian", _write("source.spm", b"garbage"), ["source.spm: not a SentencePiece model"], id="garbage source.spm"),
    pytest.param(
        "nllb", _write("sentencepiece.bpe.model", bytes(64)), ["bpe.model: not a SentencePiece"], id="garbage bpe model"
    ),
    pytest.param("marian", _longer_vocab, ["shared.weight has 174 rows", "tokenizer files"], id="vocab.json past the rows"),
    pytest.param("marian", _short_bias, ["final_logits_bias has 5 rows"], id="short logit bias"),
    pytest.param(
        "marian",
        _set("config.json", encoder_attention_heads=0, decoder_attention_heads=0),
        ["config.json", "encoder_attention_heads 0 is outside"],
        id="heads 0",
    ),
    pytest.param("marian", _set("config.json", d_model=-16), ["config.json", "d_model -16", "[32, 16]"], id="negative d_model"),
    pytest.param("nllb", _set("tokenizer.json", model=[1]), ["tokenizer.json", "model.vocab"], id="tokenizer.json model a list"),
    pytest.param("nllb", _added_token_without_id, ["tokenizer.json", "null"], id="added token without id"),
    pytest.param("marian", _write("config.json", DEEP), ["config.json: nested too deeply"], id="deep config.json"),
    pytest.param("marian", _special("config.json", os.mkfifo), ["config.json: not a regular file"], id="FIFO config.json"),
    pytest.param(
        "marian",
        _special("vocab.json", lambda path: path.symlink_to("/dev/zero")),
        ["vocab.json: not a regular file"],
        id="vocab.json is /dev/zero",
    ),
    pytest.param(
        "marian",
        _set("config.json", d_model=1048576),
        ["config.json: d_model 1048576", "fc1.weight has shape [32, 16]"],
        id="d_model 1048576",
    ),
    pytest.param(
        "marian",
        _set("config.json", max_position_embeddings=10**8),
        ["config.json: max_position_embeddings 100000000 is outside [2, 65536]"],
        id="positions 10^8",
    ),
    pytest.param(
        "marian",
        _set("config.json", max_position_embeddings=1),
        ["config.json: max_position_embeddings 1 is outside"],
        id="positions 1",
    ),
    pytest.param(
        "nllb",
        _set("config.json", decoder_layers=10**9),
        ["config.json: decoder_layers 1000000000", "2 decoder layers"],
        id="layers the weights lack",
    ),
    pytest.param(
        "marian",
        _set("tokenizer_config.json", source_lang="ROMANCE"),
        ['tokenizer_config.json: source_lang "ROMANCE" is not a language code'],
        id="source_lang ROMANCE",
    ),
]


@pytest.mark.parametrize(("family", "change", "named"), MALFORMED)
def test_a_malformed_folder_is_one_line_naming_the_file_and_nothing_is_written(
    folders: dict[str, Path], tmp_path: Path, family: str, change: Callable[[Path], object], named: list[str]
) -> None:
    folder = Path(shutil.copytree(folders[family], tmp_path / "model"))
    change(folder)
    assert_one_line_error(invoke("import", "auto", folder, "-o", tmp_path / "run"), *named)
    assert not (tmp_path / "run").exists()


def test_the_imported_beam_is_capped_at_64(folders: dict[str, Path], tmp_path: Path) -> None:
    folder = Path(shutil.copytree(folders["marian"], tmp_path / "model"))
    _json(folder / "generation_config.json", lambda g: g.update(num_beams=1_000_000))
    invoke("import", "auto", folder, "-o", tmp_path / "run")
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text(encoding="utf-8"))["decode"]["beam"] == 64


def test_the_imported_config_meets_the_recipe_rules_before_the_model_is_built(folders: dict[str, Path]) -> None:
    """What every later command would refuse is refused at import, before the weights are read or a model built."""
    from mtkit.data.tokenizer import Tokenizer

    tokenizer = Tokenizer((folders["marian"] / "source.spm").read_bytes())

    def state() -> dict:
        raise AssertionError("the weights were read")

    with pytest.raises(MtkitError, match=r"\(as mtkit's config\): 'decode.beam' is 0; give a whole number >= 1") as raised:
        pair = TokenizerPair(tokenizer, tokenizer)
        imported_model(Config(decode=DecodeConfig(beam=0)), pair, state=state, folder=folders["marian"])
    assert "\n" not in str(raised.value)


def test_a_best_pt_whose_weights_do_not_fit_its_config_is_one_line(folders: dict[str, Path], tmp_path: Path) -> None:
    invoke("import", "auto", folders["marian"], "-o", tmp_path / "run")
    payload = read_checkpoint(tmp_path / "run" / "best.pt")
    payload["config"]["model"]["ffn_dim"] = 64
    save_checkpoint(payload, tmp_path / "run" / "best.pt")
    result = invoke("translate", "-m", tmp_path / "run", input="a dog\n")
    assert_one_line_error(result, "best.pt: the weights do not fit the checkpoint's own config", "[32, 16]", "[64, 16]")


def test_an_absurd_header_size_in_a_folder_is_one_line(folders: dict[str, Path], tmp_path: Path) -> None:
    folder = Path(shutil.copytree(folders["marian"], tmp_path / "model"))
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    assert_one_line_error(invoke("import", "marian", folder, "-o", tmp_path / "run"), "model.safetensors", "header too large")
