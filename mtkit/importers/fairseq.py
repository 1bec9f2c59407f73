"""What the fairseq-born families (M2M-100 and NLLB-200, mBART-50) share: their id layout, language codes and
weights, read into mtkit's terms. m2m100.py and mbart.py keep only their config.json keys and their `Family`.

fairseq numbers a vocabulary <s> 0, <pad> 1, </s> 2, <unk> 3, then the SentencePiece pieces, then the
language codes (`deu_Latn`, `__de__`, `de_DE`) and <mask>; the table comes from tokenizer.json, else from
vocab.json with tokenizer_config.json's added tokens. The decoder starts from </s> and is forced to the
target-language code. mtkit's ids are fixed (pad 0, unk 1, bos 2, eos 3), so, as for Marian, the rows are
reordered: mtkit's BOS takes the row of </s> (the decoder start), and its logit a bias of -10,000 so that
every log-probability is the original's; fairseq's <s> becomes an ordinary piece after the specials.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtkit.config import Config, DataConfig, DecodeConfig, ModelConfig, TokenizerConfig
from mtkit.data.tokenizer import BOS_ID, TokenizerPair, code_name
from mtkit.errors import MtkitError
from mtkit.importers.loader import (
    UNFIT,
    Family,
    Imported,
    Weights,
    imported_beam,
    imported_model,
    open_weights,
    read_json,
    read_optional_json,
    read_sentencepiece,
    transformer_sizes,
    whole,
)
from mtkit.importers.marian import UNREACHABLE_BIAS, MarianVocab
from mtkit.importers.names import TokenizerFamily, layer_names

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's ids 0..3
SENTENCEPIECE = "sentencepiece.bpe.model"  # the name every family's folder gives its SentencePiece model
FILLER = "<madeupword{}>"  # the rows past the tokenizer's table (M2M-100's eight), as fairseq names them
FILLERS = 64  # the most rows past the tokenizer's table an import accepts
VOCABULARY = 1_000_000  # the largest vocabulary (TokenizerConfig's bound)
# M2M100Tokenizer's language codes (tokenizer_config.json's `language_codes`), numbered from the end of vocab.json
M2M100_CODES = {
    "m2m100": (
        "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi hr ht hu "
        "hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns oc or pa pl ps pt "
        "ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu"
    ).split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}


@dataclass(frozen=True, kw_only=True)
class FairseqSettings:
    """What differs between the fairseq-born families' config.json, as mtkit's model keys."""

    positions: str  # sinusoidal_fairseq (M2M-100, NLLB) or learned (mBART, offset 2)
    embedding_norm: bool  # mBART's layernorm_embedding
    scale_embedding: bool  # the family's default where config.json leaves it out


@dataclass(frozen=True, kw_only=True)
class FairseqNames:
    """A fairseq-born family's names: in messages, in config.json, its tokenizer classes, an example hub id."""

    name: str  # `mtkit import NAME`
    title: str  # in messages
    model_type: str  # config.json's
    architecture: str  # transformers' class
    tokenizers: tuple[TokenizerFamily, ...]  # its folders' tokenizer classes, the most particular code form first
    example: str  # a hub id


def fairseq_family(
    settings: FairseqSettings, names: FairseqNames, *, export_keys: Mapping[str, Any], logits_bias: bool
) -> Family:
    """A fairseq-born family's row of `FAMILIES`: its names, what its folder holds, its reader, and its export."""
    family = Family(
        name=names.name,
        title=names.title,
        model_types=(names.model_type,),
        architectures=(names.architecture,),
        holds=f"config.json, model.safetensors (or pytorch_model.bin), {SENTENCEPIECE} and tokenizer.json (or vocab.json)",
        example=names.example,
        hub_files=("config.json", "generation_config.json", "tokenizer*.json", "vocab.json", "*.model", "*.safetensors"),
        read=lambda folder, run: read_fairseq_run(folder, run, family=family, settings=settings),
        tokenizers=names.tokenizers,
        model_keys={"positions": settings.positions, "embedding_norm": settings.embedding_norm},
        export_keys=export_keys,
        logits_bias=logits_bias,
    )
    return family


def fairseq_model_config(settings: dict[str, Any], where: Path, *, family: FairseqSettings, weights: Weights) -> ModelConfig:
    """mtkit's `model` keys for a fairseq-born config.json: pre-norm with final layer norms, tied embeddings, and the
    output bias that keeps mtkit's BOS unreachable; special ids other than fairseq's are refused by their keys."""
    for key, wanted in (("pad_token_id", 1), ("decoder_start_token_id", 2), ("eos_token_id", 2)):
        if settings.get(key, wanted) != wanted:
            raise MtkitError(f"{where}: {key}={settings[key]!r}; mtkit imports fairseq's layout only, where it is {wanted}")
    return ModelConfig(
        **transformer_sizes(settings, where, activation="relu", weights=weights),
        norm="pre",
        positions=family.positions,
        tie_embeddings=True,
        output_bias=True,
        embedding_norm=family.embedding_norm,
        scale_embedding=bool(settings.get("scale_embedding", family.scale_embedding)),
    )


def fairseq_pieces(folder: Path, family: Family, *, vocab_size: int) -> list[str]:
    """fairseq's table (index = id) of `vocab_size` pieces: tokenizer.json's, else vocab.json's with M2M-100's
    language codes; rows past the tokenizer's (M2M-100's made-up words, at most FILLERS) named as fairseq names them."""
    if (folder / "tokenizer.json").is_file():
        found = _tokenizer_json(read_json(folder / "tokenizer.json", family), folder / "tokenizer.json")
    elif (folder / "vocab.json").is_file():
        found = {index: piece for piece, index in _ids(read_json(folder / "vocab.json", family), folder / "vocab.json")}
        found |= _added_tokens(folder, family, len(found))
    else:
        raise MtkitError(f"{folder}: no tokenizer.json or vocab.json; a {family.title} folder holds {family.holds}")
    if [found.get(index) for index in range(4)] != list(SPECIALS):
        raise MtkitError(f"{folder}: ids 0-3 are not fairseq's <s>, <pad>, </s>, <unk>; is this a {family.title} tokenizer?")
    top = max(found) + 1
    if not top <= vocab_size <= top + FILLERS or len(found) != top:
        raise MtkitError(
            f"{folder}: the tokenizer's ids run to {top - 1} with {top - len(found)} gaps, for config.json's vocab_size "
            f"{vocab_size}; the tokenizer files and config.json must belong to one model"
        )
    return [found[index] for index in range(top)] + [FILLER.format(k) for k in range(vocab_size - top)]


def _ids(table: dict[str, Any], path: Path) -> list[tuple[str, int]]:
    """A {piece: id} table's entries; an id that is not a whole number >= 0 is one line."""
    for piece, index in table.items():
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise MtkitError(f"{path}: the id of {piece[:40]!r} is {json.dumps(index)[:40]}; the ids are whole numbers from 0")
    return list(table.items())


def _tokenizer_json(data: dict[str, Any], path: Path) -> dict[int, str]:
    """id -> piece of a tokenizers file: the model's vocabulary (BPE's {piece: id}, Unigram's [[piece, score]]) and its
    added tokens ({"id": ..., "content": ...} each)."""
    model, added = data.get("model", {}), data.get("added_tokens", [])
    vocab = model.get("vocab", {}) if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        found = {index: piece for piece, index in _ids(vocab, path)}
    elif isinstance(vocab, list) and all(isinstance(entry, list) and entry and isinstance(entry[0], str) for entry in vocab):
        found = {index: entry[0] for index, entry in enumerate(vocab)}
    else:
        raise MtkitError(f"{path}: model.vocab is neither {{piece: id}} nor [[piece, score], ...]; is this a tokenizers file?")
    if not isinstance(added, list) or not all(isinstance(token, dict) for token in added):
        raise MtkitError(f"{path}: added_tokens is not a list of tokens; is this a tokenizers file?")
    return found | {index: piece for piece, index in _ids({str(t.get("content")): t.get("id") for t in added}, path)}


def _added_tokens(folder: Path, family: Family, first: int) -> dict[int, str]:
    """M2M100Tokenizer's language codes, numbered from the end of vocab.json as it numbers them: those of
    tokenizer_config.json's `language_codes` (m2m100, wmt21), or its `additional_special_tokens`."""
    path = folder / "tokenizer_config.json"
    settings = read_optional_json(path, family)
    special = settings.get("additional_special_tokens") or []
    listed = [str(code) for code in special if str(code).startswith("__")] if isinstance(special, list) else []
    named = settings.get("language_codes", "m2m100")
    if not listed and (not isinstance(named, str) or named not in M2M100_CODES):
        raise MtkitError(f"{path}: language_codes={named!r} is not one mtkit knows; it knows {', '.join(M2M100_CODES)}")
    codes = listed or [f"__{code}__" for code in M2M100_CODES[named]]
    return {first + index: code for index, code in enumerate(codes)}


def fairseq_vocab(pieces: list[str]) -> MarianVocab:
    """mtkit's order of fairseq's ids: pad, unk, </s> as BOS (the decoder start), </s> as EOS, then <s> and the rest."""
    return MarianVocab(pieces, [1, 3, 2, 2, 0, *range(4, len(pieces))])


def fairseq_tokenizers(folder: Path, family: Family, *, vocab: MarianVocab) -> TokenizerPair:
    """One tokenizer for both sides: the folder's SentencePiece model with fairseq's table in mtkit's order."""
    tokenizer = read_sentencepiece(folder / SENTENCEPIECE, family, table=vocab.table())
    if not tokenizer.codes:
        raise MtkitError(f"{folder}: the tokenizer holds no language codes; is this a {family.title} tokenizer?")
    return TokenizerPair(tokenizer, tokenizer)


def vocab_size(settings: dict[str, Any], where: Path, *, weights: Weights) -> int:
    """config.json's vocab_size: the rows of the weights' shared.weight, at most VOCABULARY (checked before the
    table is built)."""
    size, shape = whole(settings, "vocab_size", where=where), weights.shape("shared.weight")
    if shape is None:
        raise MtkitError("the weights have no tensor 'shared.weight'; do the weights belong to this config.json's model?")
    if len(shape) != 2 or size != shape[0]:
        raise MtkitError(f"{where}: vocab_size {size}, but the weights' shared.weight has shape {list(shape)}: {UNFIT}")
    if not 8 <= size <= VOCABULARY:
        raise MtkitError(f"{where}: vocab_size {size} is outside [8, {VOCABULARY}], the vocabularies mtkit builds")
    return size


def fairseq_weights(weights: Weights, model: ModelConfig, *, vocab: MarianVocab) -> dict[str, Tensor]:
    """mtkit's state dict from the checkpoint's tensors, rows of the vocabulary in mtkit's id order (each of the
    file's tensors read where it is used and dropped once it is copied: the embedding first, the largest)."""
    embedding = vocab.rows(_tensor(weights, "shared.weight"), "shared.weight")
    found_bias = weights["final_logits_bias"] if "final_logits_bias" in weights else torch.zeros(1, len(vocab.pieces))
    bias = vocab.rows(found_bias.reshape(-1), "final_logits_bias")
    bias[BOS_ID] = UNREACHABLE_BIAS
    state = {"src_embed.embedding.weight": embedding, "tgt_embed.embedding.weight": embedding, "output.weight": embedding}
    state["output.bias"] = bias
    for stack, side in (("encoder", "src"), ("decoder", "tgt")):
        for part in ("weight", "bias"):
            state[f"{stack}_norm.{part}"] = _tensor(weights, f"{stack}.layer_norm.{part}")
            if model.embedding_norm:
                state[f"{side}_embed_norm.{part}"] = _tensor(weights, f"{stack}.layernorm_embedding.{part}")
        if model.positions == "learned":  # transformers' learned table has two rows before position 0
            state[f"{side}_positions.embedding.weight"] = _tensor(weights, f"{stack}.embed_positions.weight")[2:]
    for mine, theirs in layer_names(model):
        state[mine] = torch.cat([_tensor(weights, name) for name in theirs])
    return state


def _tensor(weights: Weights, name: str) -> Tensor:
    if name not in weights:
        raise MtkitError(f"the weights have no tensor {name!r}; do the weights belong to this config.json's model?")
    return weights[name]


def fairseq_config(folder: Path, family: Family, *, model: ModelConfig, tokenizers: TokenizerPair, name: str) -> Config:
    """The run's config: the model keys, the language codes (`data.lang_tag: code`), the tokenizer's languages and
    the beam of generation_config.json, text passed to SentencePiece as it is."""
    tokenizer = tokenizers.src
    settings = read_optional_json(folder / "tokenizer_config.json", family)
    generation = read_optional_json(folder / "generation_config.json", family)
    held = family.tokenizer(
        settings.get("tokenizer_class"), [(tokenizer.table or [])[index] for index in tokenizer.codes.values()]
    )
    english = held.english if held.english in tokenizer.codes else next(iter(tokenizer.codes))
    src_lang = code_name(str(settings.get("src_lang") or english))
    tgt_lang = code_name(str(settings.get("tgt_lang") or "tgt"))  # none named: each translation names it (--tgt-lang)
    return Config(
        name=name,
        src_lang=src_lang if src_lang in tokenizer.codes else english,
        tgt_lang=tgt_lang if tgt_lang in tokenizer.codes else "tgt",
        data=DataConfig(normalize="none", lang_tag="code"),
        tokenizer=TokenizerConfig(joint=True, vocab_size=tokenizer.vocab_size, family=held.name),
        model=model,
        decode=DecodeConfig(beam=imported_beam(generation, {})),
    )


def read_fairseq_run(folder: Path, name: str, *, family: Family, settings: FairseqSettings) -> Imported:
    """A fairseq-born family's reader: its config.json's keys (compared with the weights' header first), the tokenizer
    in mtkit's order, the run's config, checked, and the weights reordered."""
    where = folder / "config.json"
    config_json = read_json(where, family)
    weights = open_weights(folder)
    model = fairseq_model_config(config_json, where, family=settings, weights=weights)
    vocab = fairseq_vocab(fairseq_pieces(folder, family, vocab_size=vocab_size(config_json, where, weights=weights)))
    tokenizers = fairseq_tokenizers(folder, family, vocab=vocab)
    config = fairseq_config(folder, family, model=model, tokenizers=tokenizers, name=name)
    return imported_model(config, tokenizers, state=lambda: fairseq_weights(weights, model, vocab=vocab), folder=folder)
