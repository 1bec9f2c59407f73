"""Tiny random Hugging Face Marian models, built locally with `transformers` (a test-only dependency).

Every parameter and `final_logits_bias` is drawn at random (the defaults of 0 and 1 would hide
mistakes); the tokenizer files come from two tiny SentencePiece models, with a vocab.json ordered
differently from the SentencePiece ids, a `>>xx<<` entry and one piece left out (it must map to unk).
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

SHARED = Path(__file__).resolve().parent / "corpus" / "multi30k"
LEFT_OUT = "▁the"  # a source piece missing from vocab.json: MarianTokenizer and mtkit both give <unk>


@dataclass
class Variant:
    activation: str = "swish"
    separate: bool = False  # target_vocab.json and separate encoder / decoder embeddings
    eos_first: bool = True  # eos id 0 (OPUS-MT's layout); False puts it elsewhere
    safetensors: bool = True
    fp16: bool = False
    bos_piece: bool = True  # False: SentencePiece models without a <s> piece (bos_id -1), as some OPUS-MT models
    generation: bool = False  # generation_config.json as OPUS-MT's: EOS forced at the cap, pad never written, 4 beams


def _sentencepiece(lang: str, size: int, bos_piece: bool = True) -> bytes:
    with gzip.open(SHARED / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
        lines = [line.strip() for line in itertools.islice(handle, 2000)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=size,
        model_type="unigram",
        bos_id=1 if bos_piece else -1,
        minloglevel=2,
    )
    return model.getvalue()


def _regular_pieces(proto: bytes) -> list[str]:
    processor = spm.SentencePieceProcessor(model_proto=proto)
    size = processor.get_piece_size()
    return [processor.id_to_piece(i) for i in range(size) if not (processor.is_control(i) or processor.is_unknown(i))]


def _vocab(pieces: list[str], seed: int, eos_first: bool, language_token: bool) -> dict[str, int]:
    """{piece: id}: </s> and <unk> first (or </s> third), the pieces shuffled, <pad> last."""
    shuffled = [piece for piece in dict.fromkeys(pieces) if piece != LEFT_OUT]
    random.Random(seed).shuffle(shuffled)
    ordered = ["</s>", "<unk>", *shuffled] if eos_first else ["<unk>", shuffled[0], "</s>", *shuffled[1:]]
    if language_token:
        ordered.insert(5, ">>xx<<")
    return {piece: index for index, piece in enumerate([*ordered, "<pad>"])}


def build_marian(folder: Path, variant: Variant | None = None, seed: int = 0):  # noqa: ANN201 - transformers' model
    """Write a tiny random Marian model (d_model 16, 4 heads, 2 + 3 layers) and its tokenizer files to `folder`."""
    from transformers import MarianConfig, MarianMTModel

    variant = variant or Variant()
    folder.mkdir(parents=True, exist_ok=True)
    source_proto = _sentencepiece("en", 120, variant.bos_piece)
    target_proto = _sentencepiece("fr", 110, variant.bos_piece)
    (folder / "source.spm").write_bytes(source_proto)
    (folder / "target.spm").write_bytes(target_proto)
    joint = [*_regular_pieces(source_proto), *_regular_pieces(target_proto)]
    source_vocab = _vocab(_regular_pieces(source_proto) if variant.separate else joint, seed, variant.eos_first, True)
    target_vocab = _vocab(_regular_pieces(target_proto), seed + 1, variant.eos_first, False) if variant.separate else source_vocab
    (folder / "vocab.json").write_text(json.dumps(source_vocab, ensure_ascii=False), encoding="utf-8")
    if variant.separate:
        (folder / "target_vocab.json").write_text(json.dumps(target_vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer_config = {"source_lang": "en", "target_lang": "fr", "separate_vocabs": variant.separate}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    config = MarianConfig(
        vocab_size=len(source_vocab),
        decoder_vocab_size=len(target_vocab),
        d_model=16,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        activation_function=variant.activation,
        max_position_embeddings=128,
        pad_token_id=target_vocab["<pad>"],
        eos_token_id=target_vocab["</s>"],
        decoder_start_token_id=target_vocab["<pad>"],
        forced_eos_token_id=None,
        scale_embedding=True,  # as every OPUS-MT model; MarianConfig defaults to false
        share_encoder_decoder_embeddings=not variant.separate,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:
                continue  # Marian's fixed sinusoids
            if "layer_norm" in name and name.endswith("weight"):
                parameter.normal_(1.0, 0.3)
            elif parameter.dim() == 2:
                parameter.normal_(0.0, parameter.size(1) ** -0.5)  # fan-in scale: outputs vary by position
            else:
                parameter.normal_(0.0, 0.3)
        model.final_logits_bias.normal_(0.0, 1.0)
    if variant.generation:
        settings = model.generation_config
        settings.forced_eos_token_id, settings.bad_words_ids = settings.eos_token_id, [[settings.pad_token_id]]
        settings.max_length, settings.num_beams, settings.renormalize_logits = 24, 4, True
    saved = model.half() if variant.fp16 else model
    saved.save_pretrained(folder, safe_serialization=variant.safetensors)
    return model.float()


def marian_tokenizer(folder: Path):  # noqa: ANN201
    from transformers import MarianTokenizer

    separate = (folder / "target_vocab.json").is_file()
    return MarianTokenizer(
        str(folder / "source.spm"),
        str(folder / "target.spm"),
        str(folder / "vocab.json"),
        target_vocab_file=str(folder / "target_vocab.json") if separate else None,
        separate_vocabs=separate,
    )
