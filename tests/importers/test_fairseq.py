"""The fairseq-born families' files read without transformers: M2M-100's id table (vocab.json, then its
language codes, then fairseq's made-up words), and the one-line refusals of a folder or hub id it cannot use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mtkit.errors import MtkitError
from mtkit.importers import FAMILIES, import_model
from mtkit.importers.fairseq import M2M100_CODES, fairseq_pieces


def _m2m100_folder(folder: Path, codes: str = "wmt21") -> Path:
    folder.mkdir()
    vocab = {piece: index for index, piece in enumerate(["<s>", "<pad>", "</s>", "<unk>", "▁a", "▁dog"])}
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"language_codes": codes}), encoding="utf-8")
    return folder


def test_m2m100s_codes_follow_vocab_json_and_made_up_words_fill_the_rest(tmp_path: Path) -> None:
    folder = _m2m100_folder(tmp_path / "model")
    size = 6 + len(M2M100_CODES["wmt21"]) + 8
    pieces = fairseq_pieces(folder, FAMILIES["m2m100"], vocab_size=size)
    assert pieces[:8] == ["<s>", "<pad>", "</s>", "<unk>", "▁a", "▁dog", "__en__", "__ha__"]
    assert pieces[-9:] == ["__de__", *(f"<madeupword{k}>" for k in range(8))]
    with pytest.raises(MtkitError, match="vocab_size 10; the tokenizer files and config.json must belong to one model"):
        fairseq_pieces(folder, FAMILIES["m2m100"], vocab_size=10)
    with pytest.raises(MtkitError, match="vocab_size 50000000; the tokenizer files"):  # not 50M made-up words
        fairseq_pieces(folder, FAMILIES["m2m100"], vocab_size=50_000_000)


def test_unknown_codes_a_missing_model_and_an_unreachable_hub_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(MtkitError, match="language_codes='klingon' is not one mtkit knows; it knows m2m100, wmt21"):
        fairseq_pieces(_m2m100_folder(tmp_path / "model", "klingon"), FAMILIES["m2m100"], vocab_size=200)
    folder = _m2m100_folder(tmp_path / "other")
    settings = {"model_type": "m2m_100", "vocab_size": 22, "d_model": 16, "encoder_layers": 1, "decoder_layers": 1}
    settings |= {"encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 8, "decoder_ffn_dim": 8}
    (folder / "config.json").write_text(json.dumps(settings), encoding="utf-8")
    save_file({"model.shared.weight": torch.zeros(22, 16)}, folder / "model.safetensors")  # its header is read first
    with pytest.raises(MtkitError, match=r"sentencepiece.bpe.model: missing; a M2M-100 or NLLB-200 folder holds") as raised:
        import_model(str(folder), tmp_path / "run")
    with pytest.raises(MtkitError, match="facebook/nllb-200-no-such-model: could not download it") as hub:
        import_model("facebook/nllb-200-no-such-model", tmp_path / "run")
    assert "\n" not in str(raised.value) + str(hub.value) and not (tmp_path / "run").exists()
