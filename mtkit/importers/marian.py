"""Import Hugging Face Marian (OPUS-MT) checkpoints as ordinary mtkit run directories.

The files are read directly (config.json, model.safetensors or pytorch_model.bin, source.spm,
target.spm, vocab.json and target_vocab.json), so `transformers` is not needed. Marian's
post-norm Transformer maps onto mtkit's with `norm: post`, `positions: sinusoidal_halves`,
`output_bias: true` and the feed-forward activation of the checkpoint.

Marian numbers its vocabulary by vocab.json, not by the SentencePiece models, and has no BOS: the
decoder starts from the pad piece. mtkit's ids are fixed (pad 0, unk 1, bos 2, eos 3), so the import
reorders the rows of the embeddings, output layer and logit bias: mtkit's BOS gets the row of
Marian's decoder start, PAD, UNK and EOS their own, and the other pieces follow in Marian's order.
When the decoder starts from pad, BOS and PAD share that row; the BOS logit then gets a bias of
-10,000, so its probability is exactly 0 in float32 and every log-probability is Marian's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtkit.config import LANGUAGE, LANGUAGE_RULE, Config, DataConfig, DecodeConfig, ModelConfig, TokenizerConfig
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, TokenizerPair
from mtkit.errors import MtkitError
from mtkit.importers.loader import (
    Family,
    Imported,
    Weights,
    import_family,
    imported_beam,
    imported_model,
    open_weights,
    read_json,
    read_optional_json,
    read_sentencepiece,
    transformer_sizes,
    whole,
)
from mtkit.importers.names import KEPT_GENERATION, TokenizerFamily, layer_names
from mtkit.models.base import EncoderDecoder

UNREACHABLE_BIAS = -1.0e4  # the BOS logit's bias when BOS shares PAD's row: exp underflows to 0
KINDS = {  # the kinds of KEPT_GENERATION, in words
    "ids": "an id (or a list of ids) of the target vocabulary's {pieces} pieces",
    "words": "a list of lists of ids of the target vocabulary's {pieces} pieces",
    "length": "a whole number above 0",
    "flag": "true or false",
}


@dataclass
class MarianVocab:
    """One side's vocabulary: Marian's pieces in Marian's id order, and the Marian id of each mtkit id."""

    pieces: list[str]
    order: list[int]  # order[mtkit_id] = marian_id

    def table(self) -> list[str]:
        """mtkit's piece table: Marian's pieces in mtkit's id order, with '<s>' for BOS."""
        return [("<s>" if index == BOS_ID else self.pieces[marian]) for index, marian in enumerate(self.order)]

    def rows(self, matrix: Tensor, name: str) -> Tensor:
        """The rows of the weights' (V, ...) tensor `name` in mtkit's id order; fewer rows than the vocabulary's
        pieces are one line."""
        if matrix.dim() == 0 or matrix.size(0) <= max(self.order):
            raise MtkitError(
                f"the weights' {name} has {matrix.size(0) if matrix.dim() else 0} rows for a vocabulary of "
                f"{len(self.pieces)} pieces; the tokenizer files and the weights must belong to one model"
            )
        return matrix.index_select(0, torch.tensor(self.order)).float()


@dataclass(kw_only=True)
class MarianModel:
    """A Marian checkpoint read into mtkit's terms: its model keys, tokenizers and weights."""

    model: ModelConfig
    tokenizers: TokenizerPair
    source: MarianVocab
    target: MarianVocab
    weights: Weights  # the checkpoint's own names, read as float32 when used
    settings: dict[str, Any]  # config.json


def read_marian(folder: Path) -> MarianModel:
    """Read and check a Marian folder; anything mtkit cannot represent is one error naming the key or file."""
    settings = read_json(folder / "config.json", MARIAN)
    weights = open_weights(folder)  # its header: the sizes are compared with it before anything is sized from them
    model = marian_model_config(settings, folder / "config.json", weights=weights)
    source, target, tokenizers = _vocabularies(folder, settings)
    return MarianModel(model=model, tokenizers=tokenizers, source=source, target=target, weights=weights, settings=settings)


def marian_model_config(settings: dict[str, Any], where: Path, *, weights: Weights) -> ModelConfig:
    """mtkit's `model` keys for a Marian config.json; a variant mtkit cannot run is refused by its key."""
    if settings.get("model_type") not in MARIAN.model_types:
        raise MtkitError(f"{where}: model_type is {settings.get('model_type')!r}; only Marian (OPUS-MT) models are imported")
    refusals = {  # each key's value in MARIAN.export_keys is the one mtkit represents
        "normalize_before": "a pre-norm Marian variant",
        "scale_embedding": "unscaled embeddings",
        "add_final_layer_norm": "a final layer norm",
        "normalize_embedding": "a layer norm on the embeddings",
    }
    for key, what in refusals.items():
        if settings.get(key, MARIAN.export_keys[key]) != MARIAN.export_keys[key]:
            raise MtkitError(f"{where}: {key}={json.dumps(settings[key])} ({what}) cannot be represented in mtkit")
    return ModelConfig(
        **transformer_sizes(settings, where, activation="swish", weights=weights),
        **MARIAN.model_keys,
        tie_embeddings=bool(settings.get("tie_word_embeddings", True)),
        output_bias=True,
    )


def _vocabularies(folder: Path, settings: dict[str, Any]) -> tuple[MarianVocab, MarianVocab, TokenizerPair]:
    """Both sides' vocabularies and mtkit tokenizers (SentencePiece models with piece tables)."""
    source_pieces = _read_vocab(folder / "vocab.json")
    separate = (folder / "target_vocab.json").is_file() and bool(settings.get("separate_vocabs", True))
    target_pieces = _read_vocab(folder / "target_vocab.json") if separate else source_pieces
    where = folder / "config.json"
    pad = whole(settings, "pad_token_id", where=where)
    target = MarianVocab(
        target_pieces,
        _order(
            target_pieces,
            where,
            pad=pad,
            unk=_piece_id(target_pieces, "<unk>", folder / "target_vocab.json" if separate else folder / "vocab.json"),
            start=whole(settings, "decoder_start_token_id", where=where, default=pad),
            eos=whole(settings, "eos_token_id", where=where),
        ),
    )
    where = folder / "vocab.json"
    if not separate:  # one table: the source takes the target's order (a source never holds the decoder start)
        _check_special(source_pieces, target, where)
        source = MarianVocab(source_pieces, target.order)
    else:
        source = MarianVocab(
            source_pieces,
            _order(
                source_pieces,
                where,
                pad=_piece_id(source_pieces, "<pad>", where),
                unk=_piece_id(source_pieces, "<unk>", where),
                start=_piece_id(source_pieces, "<pad>", where),
                eos=_piece_id(source_pieces, "</s>", where),
            ),
        )
    src = read_sentencepiece(folder / "source.spm", MARIAN, table=source.table())
    tgt = read_sentencepiece(folder / "target.spm", MARIAN, table=target.table())
    return source, target, TokenizerPair(src, tgt)


def _check_special(pieces: list[str], target: MarianVocab, where: Path) -> None:
    """A shared vocabulary's pad and eos ids (config.json) must name its <pad> and </s> pieces."""
    pad, eos = target.order[PAD_ID], target.order[EOS_ID]
    if pieces[pad] != "<pad>" or pieces[eos] != "</s>":
        raise MtkitError(
            f"{where}: pad_token_id {pad} and eos_token_id {eos} name {pieces[pad]!r} and {pieces[eos]!r}, not <pad> and "
            "</s>; a shared vocabulary needs its special ids to name them"
        )


def _order(pieces: list[str], where: Path, pad: int, unk: int, start: int, eos: int) -> list[int]:
    """order[mtkit_id] = marian_id: pad, unk, the decoder start (BOS), eos, then every other piece in Marian's order.

    `where` names the file the ids come from, for the error when one is outside the vocabulary.
    """
    for name, index in (("pad_token_id", pad), ("eos_token_id", eos), ("decoder_start_token_id", start)):
        if not 0 <= index < len(pieces):
            raise MtkitError(
                f"{where}: {name}={index} is outside the vocabulary of {len(pieces)} pieces; "
                "the special ids must name pieces of the vocabulary"
            )
    special = {pad, unk, start, eos}
    return [pad, unk, start, eos, *(index for index in range(len(pieces)) if index not in special)]


def _piece_id(pieces: list[str], piece: str, where: Path) -> int:
    if piece not in pieces:
        raise MtkitError(f"{where}: has no {piece} piece; a Marian vocabulary holds </s>, <unk> and <pad>")
    return pieces.index(piece)


def _read_vocab(path: Path) -> list[str]:
    """vocab.json ({piece: id}) as a list indexed by id; the ids must be 0..n-1, each once."""
    table = read_json(path, MARIAN)
    pieces: list[str | None] = [None] * len(table)
    for piece, index in table.items():
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(table) or pieces[index] is not None:
            raise MtkitError(f"{path}: id {index!r} of {piece!r} repeats or leaves a gap; the ids must be 0 to {len(table) - 1}")
        pieces[index] = piece
    return [piece for piece in pieces if piece is not None]


def mtkit_weights(marian: MarianModel) -> dict[str, Tensor]:
    """mtkit's state dict from Marian's tensors, rows of the vocabulary in mtkit's id order (each of the file's
    tensors read where it is used and dropped once it is copied)."""
    state = _vocabulary_rows(marian)
    for mine, theirs in layer_names(marian.model):
        state[mine] = torch.cat([_tensor(marian.weights, name) for name in theirs])
    return state


def _vocabulary_rows(marian: MarianModel) -> dict[str, Tensor]:
    """The embeddings, the output layer and its bias in mtkit's id order; with one vocabulary and tied embeddings,
    the encoder's and the decoder's must be equal."""
    weights, target, tied = marian.weights, marian.target, marian.model.tie_embeddings
    encoder_name, decoder_name = (
        f"{stack}.embed_tokens.weight" if f"{stack}.embed_tokens.weight" in weights else "shared.weight"
        for stack in ("encoder", "decoder")
    )
    decoder_embed = _tensor(weights, decoder_name)
    encoder_embed = decoder_embed if encoder_name == decoder_name else _tensor(weights, encoder_name)
    if marian.tokenizers.joint and tied and not torch.equal(encoder_embed, decoder_embed):
        raise MtkitError("config.json: share_encoder_decoder_embeddings=false with one vocabulary cannot be represented")
    state = {"src_embed.embedding.weight": marian.source.rows(encoder_embed, encoder_name)}
    del encoder_embed
    state["tgt_embed.embedding.weight"] = target.rows(decoder_embed, decoder_name)
    head_name = "lm_head.weight" if not tied and "lm_head.weight" in weights else decoder_name
    head = state["tgt_embed.embedding.weight"] if tied else target.rows(_tensor(weights, head_name), head_name)
    state["output.weight"] = head  # tied: the embedding itself, which the model ties to it
    del decoder_embed
    found_bias = weights["final_logits_bias"] if "final_logits_bias" in weights else torch.zeros(1, len(target.pieces))
    bias = target.rows(found_bias.reshape(-1), "final_logits_bias")
    if target.order[BOS_ID] == target.order[PAD_ID]:
        bias[BOS_ID] = UNREACHABLE_BIAS
    state["output.bias"] = bias
    return state


def _tensor(weights: Weights, name: str) -> Tensor:
    if name not in weights:
        raise MtkitError(f"the weights have no tensor {name!r}; is this a Marian (MarianMTModel) checkpoint?")
    return weights[name]


def imported_config(marian: MarianModel, folder: Path, *, name: str) -> Config:
    """The run's config: Marian's model keys, its languages and beam, text passed to SentencePiece as it is."""
    languages = read_optional_json(folder / "tokenizer_config.json", MARIAN)
    generation = read_optional_json(folder / "generation_config.json", MARIAN)
    return Config(
        name=name,
        src_lang=_language(languages, "source_lang", "src", folder / "tokenizer_config.json"),
        tgt_lang=_language(languages, "target_lang", "tgt", folder / "tokenizer_config.json"),
        data=DataConfig(normalize="none"),  # SentencePiece's own normaliser, as MarianTokenizer does
        tokenizer=TokenizerConfig(joint=False, vocab_size=marian.tokenizers.src.vocab_size, family=MARIAN_TOKENIZER.name),
        model=marian.model,
        decode=DecodeConfig(beam=imported_beam(generation, marian.settings)),
    )


def kept_generation(marian: MarianModel, folder: Path) -> dict[str, Any]:
    """generate()'s settings that a transformers export writes back (`KEPT_GENERATION`), token ids in mtkit's order:
    from config.json, where older folders keep them, and generation_config.json, which wins; a value that is not
    of its kind, or an id outside the target vocabulary, is refused by its key."""
    ids: dict[int, int] = {}
    for mtkit_id, marian_id in enumerate(marian.target.order):
        ids.setdefault(marian_id, mtkit_id)  # the decoder start shares pad's id: pad's own first
    kept: dict[str, Any] = {}
    path = folder / "generation_config.json"
    for where, given in ((folder / "config.json", marian.settings), (path, read_optional_json(path, MARIAN))):
        for key, kind in KEPT_GENERATION.items():
            value = given.get(key)
            if value is None:
                continue
            try:
                kept[key] = _kept_value(value, kind, ids)
            except (TypeError, KeyError):
                raise MtkitError(
                    f"{where}: {key}={json.dumps(value)[:80]} is not "
                    f"{KINDS[kind].format(pieces=len(marian.target.pieces))}; fix it or leave it out"
                ) from None
    return kept


def _kept_value(value: Any, kind: str, ids: dict[int, int]) -> Any:
    """One setting checked against its kind and its ids mapped to mtkit's (TypeError or KeyError: not of its kind)."""
    if kind == "flag":
        if not isinstance(value, bool):
            raise TypeError
        return value
    if kind == "length":
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TypeError
        return value
    if kind == "ids":
        values = value if isinstance(value, list) else [value]
        mapped = [ids[token] for token in values if isinstance(token, int) and not isinstance(token, bool)]
        if len(mapped) != len(values) or not mapped:
            raise TypeError
        return mapped if isinstance(value, list) else mapped[0]
    if not isinstance(value, list) or not all(isinstance(words, list) for words in value):
        raise TypeError
    return [_kept_value(words, "ids", ids) for words in value]  # words: lists of ids


def _language(languages: dict[str, Any], key: str, default: str, where: Path) -> str:
    """tokenizer_config.json's `source_lang` or `target_lang` (`default` where it names none): a language code, as
    every mtkit command takes the run's languages."""
    value = languages.get(key) or default
    if not isinstance(value, str) or not re.fullmatch(LANGUAGE, value):
        raise MtkitError(
            f"{where}: {key} {json.dumps(value)[:40]} is not {LANGUAGE_RULE}; write the model's language code there "
            "(a multilingual side: the code of the language you use it for)"
        )
    return value


def read_marian_run(folder: Path, name: str) -> Imported:
    """The Marian family's reader (`Family.read`): the run's config, checked, the model with Marian's weights and the
    generation settings its export keeps."""
    marian = read_marian(folder)
    config = imported_config(marian, folder, name=name)
    imported = imported_model(config, marian.tokenizers, state=lambda: mtkit_weights(marian), folder=folder)
    return dataclasses.replace(imported, generation=kept_generation(marian, folder))


# MarianTokenizer reads a target-language token >>fr<< as the first token of a text
MARIAN_TOKENIZER = TokenizerFamily(name="marian", class_name="MarianTokenizer", code=">>{}<<")
MARIAN = Family(
    name="marian",
    title="Marian",
    model_types=("marian",),
    architectures=("MarianMTModel",),
    holds="config.json, model.safetensors (or pytorch_model.bin), source.spm, target.spm and vocab.json",
    example="Helsinki-NLP/opus-mt-de-en",
    hub_files=("config.json", "generation_config.json", "tokenizer_config.json", "*.spm", "*vocab.json", "*.safetensors"),
    read=read_marian_run,
    tokenizers=(MARIAN_TOKENIZER,),
    model_keys={"norm": "post", "positions": "sinusoidal_halves"},
    # the layout MarianMTModel computes, as marian_model_config reads it: post-norm, scaled, no extra norms
    export_keys={
        "scale_embedding": True,
        "normalize_before": False,
        "add_final_layer_norm": False,
        "normalize_embedding": False,
        "static_position_embeddings": True,
    },
    logits_bias=True,
)


def import_marian(source: str, output: Path) -> tuple[Config, EncoderDecoder]:
    """`mtkit import marian`: a run directory (best.pt, config.yaml) that every mtkit command accepts."""
    return import_family(source, output, family=MARIAN)
