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


MALFORMED = {  # the review's eleven inputs (the last, a best.pt, is a test of its own), each: (folder, change, named)
    "header not an object": ("marian", lambda f: (f / "model.safetensors").write_bytes(b"\x02\0\0\0\0\0\0\0[]"), ["model.safetensors"]),
    "bin holding a list": ("marian", lambda f: _pickled(f, [torch.ones(2)]), ["pytorch_model.bin", "state dict"]),
    "bin with a number": ("marian", lambda f: _pickled(f, {"a": 1}), ["pytorch_model.bin", "state dict"]),
    "d_model Infinity": ("marian", lambda f: _json(f / "config.json", lambda c: c.update(d_model=float("inf"))), ["config.json", "d_model is Infinity"]),
    "vocab_size text": ("nllb", lambda f: _json(f / "config.json", lambda c: c.update(vocab_size="x")), ["config.json", 'vocab_size is "x"']),
    "vocab_size null": ("nllb", lambda f: _json(f / "config.json", lambda c: c.update(vocab_size=None)), ["config.json", "vocab_size is missing"]),
    "no pad_token_id": ("marian", lambda f: _json(f / "config.json", lambda c: c.pop("pad_token_id")), ["config.json", "pad_token_id is missing"]),
    "no eos_token_id": ("marian", lambda f: _json(f / "config.json", lambda c: c.pop("eos_token_id")), ["config.json", "eos_token_id is missing"]),
    "garbage source.spm": ("marian", lambda f: (f / "source.spm").write_bytes(b"garbage"), ["source.spm: not a SentencePiece model"]),
    "garbage bpe model": ("nllb", lambda f: (f / "sentencepiece.bpe.model").write_bytes(b"\0" * 64), ["sentencepiece.bpe.model: not a SentencePiece model"]),
    "vocab.json past the rows": ("marian", lambda f: _json(f / "vocab.json", lambda v: v.update({f"x{i}": len(v) + i for i in range(9)})), ["shared.weight has 174 rows", "tokenizer files"]),
    "short logit bias": ("marian", lambda f: _weights(f, lambda t: t.update(final_logits_bias=t["final_logits_bias"][:, :5])), ["final_logits_bias has 5 rows"]),
    "heads 0": ("marian", lambda f: _json(f / "config.json", lambda c: c.update(encoder_attention_heads=0, decoder_attention_heads=0)), ["config.json", "encoder_attention_heads 0 is outside"]),
    "negative d_model": ("marian", lambda f: _json(f / "config.json", lambda c: c.update(d_model=-16)), ["config.json", "d_model -16", "[32, 16]"]),
    "tokenizer.json model a list": ("nllb", lambda f: _json(f / "tokenizer.json", lambda t: t.update(model=[1])), ["tokenizer.json", "model.vocab"]),
    "added token without id": ("nllb", lambda f: _json(f / "tokenizer.json", lambda t: t["added_tokens"][0].pop("id")), ["tokenizer.json", "null"]),
    "deep config.json": ("marian", lambda f: (f / "config.json").write_text('{"a": ' * 50_000 + "1" + "}" * 50_000), ["config.json: nested too deeply"]),
    "FIFO config.json": ("marian", lambda f: ((f / "config.json").unlink(), os.mkfifo(f / "config.json")), ["config.json: not a regular file"]),
    "vocab.json is /dev/zero": ("marian", lambda f: ((f / "vocab.json").unlink(), (f / "vocab.json").symlink_to("/dev/zero")), ["vocab.json: not a regular file"]),
    "d_model 1048576": ("marian", lambda f: _json(f / "config.json", lambda c: c.update(d_model=1048576)), ["config.json: d_model 1048576", "fc1.weight has shape [32, 16]"]),
    "positions 10^8": ("marian", lambda f: _json(f / "config.json", lambda c: c.update(max_position_embeddings=10**8)), ["config.json: max_position_embeddings 100000000 is outside [2, 65536]"]),
    "positions 1": ("marian", lambda f: _json(f / "config.json", lambda c: c.update(max_position_embeddings=1)), ["config.json: max_position_embeddings 1 is outside"]),
    "layers the weights lack": ("nllb", lambda f: _json(f / "config.json", lambda c: c.update(decoder_layers=10**9)), ["config.json: decoder_layers 1000000000", "2 decoder layers"]),
    "source_lang ROMANCE": ("marian", lambda f: _json(f / "tokenizer_config.json", lambda c: c.update(source_lang="ROMANCE")), ["tokenizer_config.json: source_lang \"ROMANCE\" is not a language code"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_folder_is_one_line_naming_the_file_and_nothing_is_written(
    folders: dict[str, Path], tmp_path: Path, case: str
) -> None:
    family, change, named = MALFORMED[case]
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
        imported_model(Config(decode=DecodeConfig(beam=0)), TokenizerPair(tokenizer, tokenizer), state, folders["marian"])
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
