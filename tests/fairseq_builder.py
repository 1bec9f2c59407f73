"""Tiny random NLLB-200, M2M-100 and mBART-50 models, built locally with `transformers` (a test-only dependency).

Each folder is what the hub's holds: config.json, model.safetensors, sentencepiece.bpe.model and the tokenizer
files that the family's own tokenizer class writes (NllbTokenizer and MBart50Tokenizer: tokenizer.json;
M2M100Tokenizer: vocab.json, its pieces in an order of their own). The SentencePiece model is trained here on
a few hundred lines of the tests' Multi30k (BPE for NLLB and M2M-100, unigram for mBART-50, as the real
ones). Every parameter is drawn at random (the defaults of 0 and 1 would hide mistakes) but the pad row.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
import torch

CORPUS = Path(__file__).resolve().parent / "corpus" / "multi30k"
NLLB_CODES = ["deu_Latn", "eng_Latn", "fra_Latn"]  # a few of NLLB's 202, enough for two target languages
# how much likelier </s> is made (nats, after the decoder's last norm) so that most beams end before the output cap,
# where mtkit forces </s> and transformers stops without it
EOS_BOOST = {"nllb": 6.0, "m2m100": 8.0, "mbart": 8.0}
# each family's names of the source language and two target languages
LANGUAGES = {
    "nllb": ("deu_Latn", ("eng_Latn", "fra_Latn")),
    "m2m100": ("de", ("en", "fr")),
    "mbart": ("de_DE", ("en_XX", "fr_XX")),
}


@dataclass(frozen=True)
class Built:
    """A tiny model's folder with transformers' model and tokenizer, and the codes of its languages."""

    folder: Path
    model: object  # transformers' model, in eval mode
    tokenizer: object  # the family's tokenizer
    src_lang: str  # the tokenizer's name of the source language (deu_Latn, de, de_DE)
    tgt_langs: tuple[str, str]  # two target languages


def _sentencepiece(kind: str, size: int, four_specials: bool) -> bytes:
    lines = []
    for lang in ("de", "en", "fr"):
        with gzip.open(CORPUS / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            lines += [line.strip() for line in itertools.islice(handle, 150)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=size,
        model_type=kind,
        minloglevel=2,
        **({"bos_id": 0, "pad_id": 1, "eos_id": 2, "unk_id": 3} if four_specials else {}),  # fairseq's four as pieces
    )
    return model.getvalue()


def _m2m100_vocab(proto: bytes, seed: int) -> dict[str, int]:
    """fairseq's four specials, then the SentencePiece model's other pieces in an order of their own."""
    processor = spm.SentencePieceProcessor(model_proto=proto)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    pieces = [piece for piece in pieces if piece not in ("<unk>", "<s>", "</s>")]
    random.Random(seed).shuffle(pieces)
    return {piece: index for index, piece in enumerate(["<s>", "<pad>", "</s>", "<unk>", *pieces])}


def _tokenizer(family: str, folder: Path, four_specials: bool):  # noqa: ANN202 - transformers' tokenizer
    from transformers import M2M100Tokenizer, MBart50Tokenizer, NllbTokenizer

    proto = _sentencepiece("unigram" if family == "mbart" else "bpe", 300, four_specials)
    (folder / "sentencepiece.bpe.model").write_bytes(proto)
    if family == "nllb":
        return NllbTokenizer.from_pretrained(folder, extra_special_tokens=NLLB_CODES, src_lang="deu_Latn")
    if family == "mbart":
        return MBart50Tokenizer.from_pretrained(folder, src_lang="de_DE")
    (folder / "vocab.json").write_text(json.dumps(_m2m100_vocab(proto, 0), ensure_ascii=False), encoding="utf-8")
    return M2M100Tokenizer(vocab_file=str(folder / "vocab.json"), spm_file=str(folder / "sentencepiece.bpe.model"), src_lang="de")


def _model(family: str, vocab_size: int, seed: int):  # noqa: ANN202 - transformers' model
    from transformers import M2M100Config, M2M100ForConditionalGeneration, MBartConfig, MBartForConditionalGeneration

    torch.manual_seed(seed)
    sizes = {
        "vocab_size": vocab_size,
        "d_model": 16,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 32,
        "decoder_ffn_dim": 32,
        "max_position_embeddings": 64,
        "scale_embedding": True,
    }
    ids = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2}
    if family == "mbart":
        config = MBartConfig(**sizes, **ids, activation_function="gelu")
        model = MBartForConditionalGeneration(config)
    else:
        model = M2M100ForConditionalGeneration(M2M100Config(**sizes, **ids, activation_function="relu"))
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            norm = "norm" in name
            tensor.copy_(torch.randn_like(tensor) * (0.2 if norm else 0.5) + (1.0 if norm and name.endswith("weight") else 0.0))
        model.model.shared.weight[1].zero_()  # the pad row, as transformers leaves it
        eos = model.model.shared.weight[2]
        model.model.decoder.layer_norm.bias.add_(EOS_BOOST[family] * eos / eos.dot(eos))
        if family == "mbart":
            model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
            model.final_logits_bias[0, 2] = 0.0
    return model.eval()


def build(family: str, folder: Path, seed: int = 0, *, four_specials: bool = False) -> Built:
    """A tiny random model of `family` (nllb, m2m100 or mbart) and its tokenizer, saved in `folder`. four_specials: the
    SentencePiece model holds <s>, <pad>, </s> and <unk> as its first pieces (fairseq's ids), not the usual three."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(family, folder, four_specials)
    tokenizer.save_pretrained(folder)
    # M2M-100's model has eight rows past its tokenizer's (fairseq's made-up words)
    size = len(tokenizer.encoder) + len(tokenizer.lang_token_to_id) + 8 if family == "m2m100" else len(tokenizer.get_vocab())
    model = _model(family, size, seed)
    model.save_pretrained(folder)
    src_lang, tgt_langs = LANGUAGES[family]
    return Built(folder, model, tokenizer, src_lang, tgt_langs)
