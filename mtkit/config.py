"""Typed configuration for every stage: the dataclasses hold every default, and every rule, once.

`load_config(path, overrides)` reads a YAML recipe, applies `section.key=value` overrides and
checks every key against the dataclasses before anything else runs: an unknown key names the
closest valid key, and each value must have its field's type and pass the rule declared in the
field's metadata (choices, a numeric range, a text pattern, a relation to another key, or the
model architecture it belongs to). Relative paths in a recipe are taken from the current directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtkit.errors import MtkitError, one_line
from mtkit.options import BadBytes, SplitBy
from mtkit.run_files import RunFiles
from mtkit.textio import parse_yaml

# Keys that older versions wrote into saved configs and no longer exist; `saved=True` drops them.
RETIRED_KEYS = frozenset({"decode.nbest"})
# Keys that were renamed: the old name is still read (with a one-line note on stderr, except in saved configs).
RENAMED_KEYS = {
    "decode.batch_tokens": "batch_beam_tokens",  # it counts source tokens x beam, not padded tokens
    "data.temperature": "corpus_temperature",  # not the sampling temperature of decoding
}
_ARCH_NAMES = {"transformer": "a Transformer", "rnn": "an RNN"}  # as in "is a Transformer key"
DURATION = r"\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*"
FREEZABLE = r"\s*(embeddings|encoder|decoder)\s*"  # train.freeze
LANGUAGE = r"[a-z]{2,3}([_-][A-Za-z0-9]{1,8})*"  # a language code: de, fra, pt_BR, zh-Hant
LANGUAGE_RULE = "a language code such as de, fra or pt_BR"
NEW_LANGUAGE = rf"{LANGUAGE}\s*=\s*({LANGUAGE}|mean)"  # data.new_languages: a new code = the code it starts from
TAG_NAME = r"[A-Za-z_][A-Za-z0-9_]*"  # data.train[i].tag: the reserved source piece <NAME>
# A fine-tuning recipe (train.init_from) takes these sections from its parent; these keys of them it may change.
INHERITED_SECTIONS = ("model", "tokenizer")
FREE_WHEN_INHERITED = frozenset(
    {"model.dropout", "model.attention_dropout", "tokenizer.sampling_alpha", "tokenizer.max_sentences"}
)


@dataclass(frozen=True, kw_only=True)
class Range:
    """The numbers a key accepts. A bound of None is no bound; NaN, infinities and numbers beyond 64 bits never pass."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False  # the bound itself is excluded
    open_high: bool = False
    example: float | None = None  # shown in the error; the field's default when None

    def admits(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if isinstance(value, int) and abs(value) >= 2**63:  # beyond the 64 bits of torch, numpy and islice
            return False
        above = self.low is None or value > self.low or (value == self.low and not self.open_low)
        below = self.high is None or value < self.high or (value == self.high and not self.open_high)
        return above and below

    def describe(self, *, whole: bool) -> str:
        """'a whole number >= 1', 'a number in [0, 1)', ..."""
        kind = "a whole number" if whole else "a number"
        if self.low is not None and self.high is not None:
            left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
            return f"{kind} in {left}{_number(self.low)}, {_number(self.high)}{right}"
        if self.low is not None:
            return f"{kind} {'>' if self.open_low else '>='} {_number(self.low)}"
        if self.high is not None:
            return f"{kind} {'<' if self.open_high else '<='} {_number(self.high)}"
        return f"a finite {kind.removeprefix('a ')}"


@dataclass(frozen=True, kw_only=True)
class Pattern:
    """The texts a key accepts: a regular expression that must match the whole value."""

    regex: str
    description: str
    example: str


def _choice(*values: str) -> dict[str, tuple[str, ...]]:
    return {"choices": values}


def _range(
    low: float | None = None,
    high: float | None = None,
    *,
    open_low: bool = False,
    open_high: bool = False,
    example: float | None = None,
) -> dict[str, Range]:
    return {"range": Range(low=low, high=high, open_low=open_low, open_high=open_high, example=example)}


def _at_least(low: int, example: int | None = None) -> dict[str, Range]:
    return _range(low, example=example)


def _pattern(regex: str, description: str, example: str) -> dict[str, Pattern]:
    return {"pattern": Pattern(regex=regex, description=description, example=example)}


def _relation(check: Callable[[Any], str | None]) -> dict[str, Callable[[Any], str | None]]:
    """A rule between keys of one section: `check(section)` gives the advice when it is broken."""
    return {"relation": check}


_TRANSFORMER = {"arch": "transformer"}
_RNN = {"arch": "rnn"}


def _heads_divide_d_model(model: ModelConfig) -> str | None:
    """Each head gets d_model / heads dimensions, so heads must divide d_model."""
    if model.d_model % model.heads == 0:
        return None
    near = sorted(range(max(1, model.heads - 64), model.heads + 65), key=lambda h: abs(h - model.heads))
    example = next((h for h in near if model.d_model % h == 0), 1)
    return f"give a whole number that divides model.d_model ({model.d_model}), such as {example}"


def _even_when_bidirectional(model: ModelConfig) -> str | None:
    """A bidirectional encoder gives each direction half of hidden_size."""
    if not model.bidirectional or model.hidden_size % 2 == 0:
        return None
    return f"give an even number with model.bidirectional (half per direction), such as {model.hidden_size + 1}"


def _input_feed_needs_luong(model: ModelConfig) -> str | None:
    if not model.input_feed or model.attention.startswith("luong"):
        return None
    return (
        f"input feeding needs Luong attention but model.attention is {model.attention}; "
        "set model.attention=luong_dot or luong_general, or model.input_feed=false"
    )


@dataclass(kw_only=True)
class SplitConfig:
    """Where one split's sentence pairs come from: exactly one of src+tgt, tsv, jsonl, tmx or hf."""

    src: str | None = None  # plain text, one sentence a line (.gz ok)
    tgt: str | None = None
    tsv: str | None = None  # "source<TAB>target" a line (.gz ok)
    jsonl: str | None = None  # {"<src_lang>": .., "<tgt_lang>": ..} or {"translation": {..}} a line
    tmx: str | None = None  # a TMX translation memory (.gz ok): the segments in src_lang and tgt_lang of each unit
    hf: str | None = None  # Hugging Face dataset name (online) or a save_to_disk directory
    split: str | None = None  # the split of `hf` (train, validation, test, ...)
    limit: int | None = field(default=None, metadata=_at_least(1, 10000))  # keep only the first N pairs
    # the languages of this split's pairs (a multilingual recipe); None: the recipe's src_lang / tgt_lang
    src_lang: str | None = field(default=None, metadata=_pattern(LANGUAGE, LANGUAGE_RULE, "de"))
    tgt_lang: str | None = field(default=None, metadata=_pattern(LANGUAGE, LANGUAGE_RULE, "fr"))


SAMPLING_RULE = r"topk:[1-9][0-9]*|topp:(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)|full"  # as mtkit translate --sampling
# Sampling's temperature wherever it is read (--temperature, a request's, a synthetic side's decode.temperature):
# below the floor the scaled float32 logits overflow to -inf and the draw fails; at the ceiling it is uniform already.
TEMPERATURE = Range(low=0.01, high=100.0, example=1.0)
# Sampling's defaults, stated once below every stage that samples: decoding's `Sampling` (and through it
# --temperature, --seed and a request's) and a synthetic side's decode.temperature and decode.seed.
SAMPLING_TEMPERATURE = 1.0
SAMPLING_SEED = 0


@dataclass(kw_only=True)
class SyntheticDecodeConfig:
    """How a model writes a synthetic corpus (`data.train[i].decode`): the recipe's decode keys, and sampling.

    A recipe section, like `DecodeConfig`; `mtkit.synthetic.generate` turns it into each chunk's `Decoding`
    (the per-call options of `Translator`), whose None leaves the writing model's own `DecodeConfig` value.
    """

    beam: int | None = field(default=None, metadata=_at_least(1))  # None: the model's own beam
    length_penalty: float | None = field(default=None, metadata=_range(0.0, 10.0))
    # draw each translation instead of searching: topk:K, topp:P or full (sampled back-translations)
    sampling: str | None = field(default=None, metadata=_pattern(SAMPLING_RULE, "topk:K, topp:P or full", "topk:10"))
    temperature: float = field(default=SAMPLING_TEMPERATURE, metadata={"range": TEMPERATURE})
    seed: int = field(default=SAMPLING_SEED, metadata=_range(0, 2**63 - 1))


@dataclass(kw_only=True)
class TrainSource(SplitConfig):
    """One training corpus: a split's source plus how often its pairs are drawn and its name in reports.

    A synthetic corpus names a model that writes one of its sides (generated once by `mtkit prepare`,
    cached in the data directory): `translate_with` writes the target of `src`, `back_translate_with`
    the source of `tgt`. `tag` puts the reserved source piece <tag> first on each of its sources.
    """

    # pairs drawn per epoch relative to the corpus size: 2.0 doubles it, 0.1 keeps a tenth (resampled each epoch)
    weight: float = field(default=1.0, metadata=_range(0.0, 1000.0, open_low=True, example=0.5))
    name: str | None = field(default=None, metadata=_pattern(r"[^\s,]+", "a name without spaces or commas", "news"))
    # a run, import or CTranslate2 export (several runs: an ensemble) that writes the target of `src`
    translate_with: list[str] | None = field(default=None, metadata=_relation(lambda s: _one_side(s, "src", "tgt")))
    # a model of the reverse direction that writes the source of `tgt`
    back_translate_with: list[str] | None = field(default=None, metadata=_relation(lambda s: _one_side(s, "tgt", "src")))
    tag: str | None = field(default=None, metadata=_pattern(TAG_NAME, "a letter, then letters, digits or _", "bt"))
    decode: SyntheticDecodeConfig | None = None  # with a model: how it translates

    @property
    def generated_side(self) -> str | None:
        """The side a model writes: "tgt" (translate_with), "src" (back_translate_with) or None."""
        return "tgt" if self.translate_with else "src" if self.back_translate_with else None

    @property
    def writer_models(self) -> list[str]:
        return self.translate_with or self.back_translate_with or []


def _one_side(source: TrainSource, given: str, written: str) -> str | None:
    """A synthetic corpus gives the side its model reads as a text file and leaves the other to the model."""
    if source.translate_with and source.back_translate_with:
        return "give translate_with (a model writes the target) or back_translate_with (the source), not both"
    if source.tsv or source.jsonl or source.tmx or source.hf or getattr(source, written) or not getattr(source, given):
        return f"a model writes this corpus's {written}: give {given} (a text file, one sentence a line) and no {written}"
    return None


def _unique_names(data: DataConfig) -> str | None:
    idle = [index for index, source in enumerate(data.train) if source.decode is not None and source.generated_side is None]
    if idle:
        key = recipe_key(data, "train", index=idle[0])
        return f"{key}.decode says how a model writes a corpus: give it translate_with or back_translate_with"
    names = [source.name for source in data.train if source.name is not None]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        return f"give each corpus its own name ({repeated[0]!r} is used twice)"
    weighted = [index for index, source in enumerate(data.train) if source.weight != 1.0]
    if data.corpus_temperature is not None and weighted:
        return (
            "data.corpus_temperature sets every corpus's weight from its size, but "
            f"{recipe_key(data, 'train', index=weighted[0])}.weight is {data.train[weighted[0]].weight:g}; "
            "give either data.corpus_temperature or weights, not both"
        )
    return None


def _languages(text: str) -> list[str]:
    """data.langs as a list: 'de, fr' -> ['de', 'fr']."""
    return [lang.strip() for lang in text.split(",") if lang.strip()]


def _dual_xent_rule(data: DataConfig) -> str | None:
    """Both models of the dual cross-entropy rule, and one way to drop pairs with them."""
    models = data.dual_xent_forward, data.dual_xent_backward
    if None in models:
        missing = "data.dual_xent_backward" if data.dual_xent_forward is not None else "data.dual_xent_forward"
        if models == (None, None):
            return "it needs data.dual_xent_forward and data.dual_xent_backward: the run directories of the two models"
        return f"the rule reads a model of each direction: set {missing} too"
    if (data.dual_xent_max is None) == (data.dual_xent_drop is None):
        return "set one of data.dual_xent_max (a score, such as 3.0) or data.dual_xent_drop (a share, such as 0.1)"
    return None


def _qe_rule(data: DataConfig) -> str | None:
    """A COMET-QE model and its threshold, together."""
    if data.qe_model is None:
        return "it needs data.qe_model: a reference-free COMET folder or hub id, such as Unbabel/wmt22-cometkiwi-da"
    if data.qe_min is None:
        return "set data.qe_min too: pairs scoring below it are dropped, such as 0.5"
    return None


@dataclass(kw_only=True)
class DataConfig:
    """Corpora and the cleaning rules applied to the training split.

    `train` is one source or a list of them (several corpora, each with a weight and a name).
    """

    train: list[TrainSource] = field(default_factory=lambda: [TrainSource()], metadata=_relation(_unique_names))
    # one split or a list of them (a multilingual recipe: one per direction, each with src_lang/tgt_lang)
    valid: list[SplitConfig] = field(default_factory=lambda: [SplitConfig()])
    test: list[SplitConfig] | None = None
    # target: every source starts with a tag (one reserved piece, <2xx>) naming its target language; code: an
    # imported M2M-100, NLLB-200 or mBART-50 model's own language codes, the source's in front of the source and
    # the target's forced as the translation's first token (written by `mtkit import`)
    lang_tag: str = field(default="none", metadata=_choice("none", "target", "code"))
    # more languages to reserve tags for (to be added later by fine-tuning), separated by commas
    langs: str = field(
        default="", metadata=_pattern(rf"\s*|\s*{LANGUAGE}\s*(,\s*{LANGUAGE}\s*)*", "language codes separated by commas", "de,fr")
    )
    # fine-tuning an imported NLLB-200, M2M-100 or mBART-50 model: language codes to add, each with the code whose
    # embedding row its row starts from, or `mean` (of every code's row): "xyz_Latn=fra_Latn, abc_Latn=mean"
    new_languages: str = field(
        default="",
        metadata=_pattern(
            rf"\s*|\s*{NEW_LANGUAGE}\s*(,\s*{NEW_LANGUAGE}\s*)*", "new codes with the code they start from", "xyz_Latn=fra_Latn"
        ),
    )
    # corpus weights from their sizes: pairs drawn per epoch p ~ n^(1/T) (1: as they are; larger: flatter)
    corpus_temperature: float | None = field(default=None, metadata=_range(1.0, 100.0, example=5.0))
    normalize: str = field(default="NFC", metadata=_choice("NFC", "NFKC", "none"))
    bad_bytes: str = field(default="error", metadata=_choice(*(choice.value for choice in BadBytes)))  # bytes that are not UTF-8
    # drop training pairs with more whitespace tokens than this on a side
    max_len: int = field(default=250, metadata=_at_least(1))
    # drop training pairs whose token-length ratio (longer / shorter, so >= 1) exceeds this
    max_ratio: float = field(default=3.0, metadata=_range(1.0))
    dedup: bool = True  # drop repeated (source, target) pairs
    drop_copies: bool = True  # drop pairs whose target equals the source
    # drop pairs whose source py3langid does not identify as the source language, or target as the target's
    # (pip install 'mtkit[langid]')
    langid: bool = False
    # dual conditional cross-entropy (Junczys-Dowmunt 2018): mtkit models (run directories) of the two directions,
    # source->target and target->source; each pair scores |H_fwd - H_bwd| + (H_fwd + H_bwd) / 2 in nats a token
    dual_xent_forward: str | None = field(default=None, metadata=_relation(_dual_xent_rule))
    dual_xent_backward: str | None = field(default=None, metadata=_relation(_dual_xent_rule))
    # with the two models, one of: drop pairs scoring above this, or this share of each chunk, the worst first
    dual_xent_max: float | None = field(default=None, metadata=_range(0.0, example=3.0) | _relation(_dual_xent_rule))
    dual_xent_drop: float | None = field(
        default=None, metadata=_range(0.0, 1.0, open_low=True, open_high=True, example=0.1) | _relation(_dual_xent_rule)
    )
    # a reference-free COMET model (a folder or hub id; offline, its encoder's folder in qe_encoder): drop pairs
    # scoring below qe_min
    qe_model: str | None = field(default=None, metadata=_relation(_qe_rule))
    qe_encoder: str | None = field(default=None, metadata=_relation(_qe_rule))
    qe_min: float | None = field(default=None, metadata=_range(example=0.5) | _relation(_qe_rule))


@dataclass(kw_only=True)
class TokenizerConfig:
    """SentencePiece settings."""

    type: str = field(default="bpe", metadata=_choice("bpe", "unigram"))
    # 4 special pieces (pad, unk, bos, eos) and a few characters; SentencePiece reads it as a 32-bit int
    vocab_size: int = field(default=8000, metadata=_range(8, 1_000_000))
    joint: bool = True  # one model for both languages (needed for tied embeddings)
    character_coverage: float = field(default=1.0, metadata=_range(0.0, 1.0, open_low=True))
    max_sentences: int = field(default=2_000_000, metadata=_at_least(1))  # sentences sampled for SentencePiece training
    # subword regularisation: training pairs re-segmented every epoch by SentencePiece sampling (BPE: the
    # dropout probability, e.g. 0.1; unigram: the smoothing alpha, e.g. 0.1-0.5); 0 = off. Validation and
    # decoding always use the best segmentation.
    sampling_alpha: float = field(default=0.0, metadata=_range(0.0, 1.0, open_high=True, example=0.1))
    # an imported model's tokenizer family (marian, nllb, ...), written by `mtkit import` and inherited by its fine-tuned
    # children: the transformers export writes that family's classes back; none for mtkit's own tokenizers
    family: str | None = field(default=None, metadata=_pattern(r"[a-z][a-z0-9_]*", "a family's name", "nllb"))


@dataclass(kw_only=True)
class ModelConfig:
    """Architecture and size. `arch` picks the model; the other keys size it.

    Shared: layers, dropout, tie_embeddings. Transformer only: d_model, heads, ffn_dim,
    attention_dropout, norm, positions, max_positions, activation, encoder_layers, decoder_layers,
    output_bias, embedding_norm, scale_embedding. RNN only: cell .. input_feed. A recipe that
    sets a key of the other architecture is an error; saved configs hold only the chosen one's keys.
    """

    arch: str = field(default="transformer", metadata=_choice(*_ARCH_NAMES))
    # encoder and decoder layers each; the upper bounds keep a checkpoint's config from sizing more than any model
    layers: int = field(default=6, metadata=_range(1, 1024))
    d_model: int = field(default=512, metadata=_TRANSFORMER | _at_least(1))
    heads: int = field(default=8, metadata=_TRANSFORMER | _at_least(1) | _relation(_heads_divide_d_model))
    ffn_dim: int = field(default=2048, metadata=_TRANSFORMER | _at_least(1))
    dropout: float = field(default=0.1, metadata=_range(0.0, 1.0, open_high=True))
    attention_dropout: float = field(default=0.0, metadata=_TRANSFORMER | _range(0.0, 1.0, open_high=True, example=0.1))
    norm: str = field(default="pre", metadata=_TRANSFORMER | _choice("pre", "post"))
    # sinusoidal: sine and cosine columns interleaved; sinusoidal_halves: all sines, then all cosines
    # (Marian's and CTranslate2's layout, tabled in float64); sinusoidal_fairseq: sines then cosines over half the
    # dimension minus one, positions counted from 2 (M2M-100's and NLLB's); learned: a trained table
    positions: str = field(
        default="sinusoidal",
        metadata=_TRANSFORMER | _choice("sinusoidal", "sinusoidal_halves", "learned", "sinusoidal_fairseq"),
    )
    tie_embeddings: bool = True  # share source, target and output embeddings (joint vocab)
    # longest sequence (tokens + EOS) with learned positions; at least one token and its EOS
    max_positions: int = field(default=1024, metadata=_TRANSFORMER | _range(2, 65536))
    activation: str = field(default="relu", metadata=_TRANSFORMER | _choice("relu", "gelu", "swish"))  # feed-forward
    # encoder and decoder depth when they differ from `layers` (0: `layers`)
    encoder_layers: int = field(default=0, metadata=_TRANSFORMER | _range(0, 1024, example=6))
    decoder_layers: int = field(default=0, metadata=_TRANSFORMER | _range(0, 1024, example=6))
    output_bias: bool = field(default=False, metadata=_TRANSFORMER)  # a bias on the output logits (Marian's)
    embedding_norm: bool = field(default=False, metadata=_TRANSFORMER)  # a LayerNorm on embeddings + positions (mBART's)
    scale_embedding: bool = field(default=True, metadata=_TRANSFORMER)  # embeddings times sqrt(d_model)
    cell: str = field(default="lstm", metadata=_RNN | _choice("lstm", "gru"))
    # RNN state size (a bidirectional encoder gives each direction half)
    hidden_size: int = field(default=512, metadata=_RNN | _at_least(1) | _relation(_even_when_bidirectional))
    embed_dim: int = field(default=256, metadata=_RNN | _at_least(1))  # RNN embedding and readout size
    bidirectional: bool = field(default=True, metadata=_RNN)  # RNN encoder reads the source both ways
    attention: str = field(default="bahdanau", metadata=_RNN | _choice("none", "bahdanau", "luong_dot", "luong_general"))
    # Luong input feeding: the previous attentional vector is a decoder input
    input_feed: bool = field(default=False, metadata=_RNN | _relation(_input_feed_needs_luong))


def _comet_key_needs_metric(train: TrainConfig) -> str | None:
    """The COMET keys are read with train.validate_metric comet or qe only: alone they would change nothing."""
    if train.validate_metric != "bleu":
        return None
    return "it is read with train.validate_metric comet (or qe, reference-free): set that too, or leave this key out"


def _what_fsdp_cannot_do(train: TrainConfig) -> str | None:
    """Sharded training's refusals among the train keys (the ones that need the whole recipe or the job are
    mtkit.training.sharding's): each keeps whole weights in one process, or is decided by rank 0 alone."""
    if train.shard != "fsdp":
        return None
    refused = {
        "ema": (train.ema > 0, "set train.ema=0 (the average would be a whole copy of the weights in each process)"),
        "bf16_weights": (train.bf16_weights == "true", "set train.bf16_weights=auto (on CUDA FSDP computes in bf16 itself)"),
        "precision": (train.precision == "fp16", "set train.precision=bf16 (fp16's loss scaler sees one shard's gradients)"),
        # (and so train.cuda_graphs, which replay a compiled step)
        "compile": (train.compile in ("true", "layers"), "set train.compile=auto (a compiled step is not tried with FSDP)"),
        "snapshots": (bool(train.snapshots.strip()), "remove train.snapshots (rank 0 alone times them, every rank writes)"),
        "lora": (train.lora is not None, "remove train.lora (its adapters are not tried with FSDP)"),
    }
    for key, (asked, fix) in refused.items():
        if asked:
            return f"FSDP cannot take train.{key} as given: {fix}, or set train.shard=none"
    return None


# train.lora.targets: mtkit's own module names of the layers LoRA adapts (mtkit.models.lora)
LORA_TARGETS = {
    "qkv": "self-attention's query, key and value projections (fused)",
    "query": "cross-attention's query projection",
    "key_value": "cross-attention's key and value projections (fused)",
    "out": "both attentions' output projections",
    "inner": "the feed-forward's first layer",
    "outer": "the feed-forward's second layer",
    "embedding": "the embedding tables (and the output layer tied to them)",
}


def _known_targets(lora: LoraConfig) -> str | None:
    """Each target names a layer kind of mtkit's Transformer, once."""
    valid = ", ".join(LORA_TARGETS)
    unknown = next((target for target in lora.targets if target not in LORA_TARGETS), None)
    if unknown is not None and "," in unknown:
        return f"give a list of layer names, such as [qkv, out] (valid: {valid})"
    if unknown is not None:
        return f"{unknown!r} is not a layer LoRA adapts; give some of {valid}"
    if len(set(lora.targets)) < len(lora.targets):
        return "give each layer name once"
    return None


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """Low-rank adapters (`train.lora`, Hu et al. 2021): the parent's weights stay frozen and each adapted layer
    learns scaling * B A, with scaling = alpha / rank (mtkit.models.lora); checkpoints hold the adapters alone."""

    rank: int = field(default=8, metadata=_range(1, 65536, example=16))
    alpha: float = field(default=16.0, metadata=_range(0.0, 1e6, open_low=True, example=16.0))
    dropout: float = field(default=0.0, metadata=_range(0.0, 1.0, open_high=True, example=0.1))  # on the adapters' input
    targets: list[str] = field(default_factory=lambda: ["qkv", "query", "key_value", "out"], metadata=_relation(_known_targets))
    # hold the frozen base weights in bf16 (adapters stay fp32): needs CUDA and precision bf16; auto: on with them
    bf16_base: str = field(default="auto", metadata=_choice("auto", "true", "false"))


@dataclass(kw_only=True)
class TrainConfig:
    """The training loop: batching, optimiser, schedule, stopping."""

    # padded tokens per update's batch (sentences x longest side); decoding's batches are decode.batch_beam_tokens
    batch_tokens: int = field(default=4096, metadata=_at_least(1))
    lr: float = field(default=7e-4, metadata=_range(0.0, 10.0, open_low=True))  # peak learning rate, reached after warmup
    # the schedule's scale: warmup 0 would make every learning rate 0
    warmup_steps: int = field(default=4000, metadata=_at_least(1))
    # after warmup: 1/sqrt decay, or linear / cosine decay to min_lr at max_steps (or at max_time)
    schedule: str = field(
        default="inverse_sqrt",
        metadata={
            **_choice("inverse_sqrt", "linear", "cosine"),
            **_relation(
                lambda t: (
                    None
                    if t.schedule == "inverse_sqrt" or t.max_steps or t.max_time
                    else "it decays to train.min_lr at the end of training: set train.max_steps or train.max_time"
                )
            ),
        },
    )
    min_lr: float = field(
        default=0.0,
        metadata={**_range(0.0, 10.0), **_relation(lambda t: None if t.min_lr < t.lr else "give a learning rate below train.lr")},
    )
    label_smoothing: float = field(default=0.1, metadata=_range(0.0, 1.0, open_high=True))
    clip_norm: float = field(default=1.0, metadata=_range(0.0))  # 0 disables clipping
    accumulate: int = field(default=1, metadata=_at_least(1))  # batches per update
    max_steps: int = field(default=0, metadata=_at_least(0, 10000))  # updates; 0 = no limit
    max_epochs: int = field(default=0, metadata=_at_least(0, 20))  # 0 = no limit
    # wall-clock limit such as "90m", "2h", "600s"
    max_time: str | None = field(
        default=None, metadata=_pattern(rf"\s*|{DURATION}", "a duration (a number of seconds, or with s, m, h or d)", "90m")
    )
    # also write the weights as RUN/at_<time>.pt once training has run each of these times ("15m,30m,60m")
    snapshots: str = field(
        default="", metadata=_pattern(rf"\s*|{DURATION}(,{DURATION})*", "durations separated by commas", "15m,30m,60m")
    )
    validate_every: int = field(default=1000, metadata=_at_least(1))  # updates between validations (and checkpoints)
    valid_beam: int = field(default=1, metadata=_at_least(1))  # beam used to decode the valid set for BLEU
    # what chooses best.pt and drives train.patience: bleu, or the COMET model train.comet_model's score, against the
    # references (comet) or from the source alone (qe); BLEU is validated and logged with either
    validate_metric: str = field(
        default="bleu",
        metadata={
            **_choice("bleu", "comet", "qe"),
            **_relation(
                lambda t: (
                    None
                    if t.validate_metric == "bleu" or t.comet_model
                    else "give train.comet_model, a COMET folder (hparams.yaml, checkpoints/model.ckpt) or hub id, "
                    "such as Unbabel/wmt22-comet-da for comet or Unbabel/wmt22-cometkiwi-da for qe"
                )
            ),
        },
    )
    # with validate_metric comet or qe: the COMET model (as `mtkit evaluate --comet-model`), loaded once per training
    comet_model: str | None = field(default=None, metadata=_relation(_comet_key_needs_metric))
    # offline: the folder of the encoder the COMET model's hparams.yaml names (as `mtkit evaluate --comet-encoder`)
    comet_encoder: str | None = field(default=None, metadata=_relation(_comet_key_needs_metric))
    # COMET scores the first N lines of each validation set (it costs more than decoding them); 0 = all
    validate_lines: int = field(
        default=0,
        metadata={**_at_least(0, 500), **_relation(lambda t: None if t.validate_lines == 0 else _comet_key_needs_metric(t))},
    )
    # stop after this many validations without a better BLEU; 0 = never
    patience: int = field(default=0, metadata=_at_least(0, 10))
    log_every: int = field(default=100, metadata=_at_least(1))
    # also keep the weights of the last N validations as step_*.pt; 0 = none
    keep: int = field(default=0, metadata=_at_least(0, 5))
    # at the end, average the last N kept step_*.pt into average.pt and validate it; 0 = off
    average_last: int = field(
        default=0,
        metadata={
            **_at_least(0, 5),
            **_relation(
                lambda t: None if t.average_last <= t.keep else "give train.keep >= train.average_last (what it averages)"
            ),
        },
    )
    # decay of an exponential moving average of the weights, written as ema.pt and validated at the end; 0 = off
    ema: float = field(default=0.0, metadata=_range(0.0, 1.0, open_high=True, example=0.999))
    # stop after this many updates in a row with a NaN/inf loss or gradient
    max_nonfinite: int = field(default=10, metadata=_at_least(1))
    seed: int = field(default=1, metadata=_range(0, 2**32 - 1))
    device: str = field(default="auto", metadata=_pattern(r"auto|cpu|cuda(:[0-9]+)?", "auto, cpu, cuda or cuda:N", "cpu"))
    precision: str = field(default="auto", metadata=_choice("auto", "fp32", "bf16", "fp16"))
    threads: int = field(default=0, metadata=_range(0, 1024, example=4))  # CPU threads for torch; 0 = all cores
    # The GPU levers (docs/performance.md, "Training on a GPU"); auto: on with CUDA, off on the CPU.
    # compile: torch.compile the training forward pass and its loss (the loss fused into a few kernels); auto leaves
    # it off for a train.max_time under 30 minutes (compiling takes minutes); layers: each layer compiled on its own
    # (mtkit.training.regional), so the compiler traces one layer of each kind instead of the whole step
    compile: str = field(default="auto", metadata=_choice("auto", "true", "false", "layers"))
    # round each batch's lengths up to a multiple of this: fewer shapes for a compiled step, more padding (on short
    # sentences it cost more than it gave on an H200: docs/performance.md)
    length_multiple: int = field(default=1, metadata=_range(1, 1024, example=8))
    # at most this many batch shapes an epoch: pairs in length buckets, each batch padded to its bucket's length
    # (mtkit.training.buckets), so a compiled step or CUDA graphs see few shapes, for more padding; 0: off,
    # token-budget batches padded to their own longest pair; auto: 16 with CUDA, off on the CPU
    shapes: str = field(
        default="0",
        metadata={
            **_pattern(r"auto|[0-9]|[1-5][0-9]|6[0-4]", "auto, 0 (off) or a number of shapes up to 64", "16"),
            **_relation(
                lambda t: (
                    None
                    if t.shapes == "0" or t.length_multiple == 1
                    else "give train.length_multiple=1 with it (the buckets fix the lengths), or train.shapes=0"
                )
            ),
        },
    )
    # replay the compiled step as CUDA graphs (torch.compile's "reduce-overhead"): a few launches an update instead of
    # thousands of kernel launches, one graph recorded per batch shape; needs train.compile and train.shapes; auto: off
    cuda_graphs: str = field(
        default="auto",
        metadata={
            **_choice("auto", "true", "false"),
            **_relation(
                lambda t: (
                    None
                    if t.cuda_graphs != "true" or (t.compile != "false" and t.shapes != "0")
                    else "give train.compile (true or layers) and train.shapes (e.g. 16) with it: a graph is recorded per shape"
                )
            ),
        },
    )
    # recompute each layer's activations in the backward pass instead of keeping them (mtkit.training.recompute): one
    # layer's activations held at a time, for a second forward pass through each layer; for models of 600M+ parameters
    checkpoint_activations: bool = False
    # where a compiled step's compiler cache is kept between runs (mtkit.training.compile_cache): a folder, auto
    # ($MTKIT_CACHE_DIR/compile, else ~/.cache/mtkit/compile) or false (off)
    compile_cache: str = field(default="auto", metadata={"words": ("false",)} | _relation(lambda t: _a_folder(t.compile_cache)))
    # on CUDA, let scaled-dot-product attention use cuDNN's kernel: it plans each new (rows, length) shape (many times
    # slower on shapes not seen before), so it is meant for bounded shapes (train.shapes); auto: off; the CPU has none
    cudnn_attention: str = field(default="auto", metadata=_choice("auto", "true", "false"))
    # collate and copy the next batch while the GPU works on this one (before the update's one host sync)
    prefetch: str = field(default="auto", metadata=_choice("auto", "true", "false"))
    # compute the output layer inside the loss, chunk by chunk, never holding the (tokens x vocabulary) logits or
    # their gradient (mtkit.training.fused_loss): less memory, slower (measured); auto: off
    fused_loss: str = field(default="auto", metadata=_choice("auto", "true", "false"))
    # hold the model's weights in bf16 and let the optimiser update fp32 master copies (mtkit.training.master_weights):
    # no weight casts under bf16 autocast; auto: off (no faster on an H200, eager); not with precision fp16
    bf16_weights: str = field(default="auto", metadata=_choice("auto", "true", "false"))
    # also write the log's figures as TensorBoard events under RUN/tensorboard (pip install 'mtkit[tensorboard]')
    tensorboard: bool = False
    # fine-tune: start from this run directory's (or checkpoint's) weights, architecture and tokenizers
    init_from: str | None = None
    # under torchrun: none, every process holds the whole model (DDP); fsdp, each holds a share of the weights, gradients
    # and Adam's moments (torch's FSDP2, mtkit.training.sharding), for models bigger than one process's memory
    shard: str = field(default="none", metadata={**_choice("none", "fsdp"), **_relation(_what_fsdp_cannot_do)})
    # parts of the model not trained: embeddings, encoder, decoder (separated by commas)
    freeze: str = field(
        default="",
        metadata=_pattern(
            rf"\s*|{FREEZABLE}(\s*,\s*{FREEZABLE})*", "parts separated by commas: embeddings, encoder, decoder", "embeddings"
        ),
    )
    # fine-tune low-rank adapters on the frozen parent of train.init_from instead of every weight (LoraConfig)
    lora: LoraConfig | None = None


@dataclass(kw_only=True)
class DecodeConfig:
    """Search settings used by translate, evaluate and validation: the recipe's `decode` section, saved with
    the model. A `Translator` holds it as its defaults; `Translator.search_options` fills what a call's
    `Decoding` leaves open (None) from it when it builds the search's `SearchOptions`."""

    beam: int = field(default=5, metadata=_at_least(1))
    # score / length**length_penalty; above 10, long hypotheses' divisors overflow float32
    length_penalty: float = field(default=1.0, metadata=_range(0.0, 10.0))
    # maximum output length = a * source length + b
    max_len_a: float = field(default=1.2, metadata=_range(0.0, 10.0))
    max_len_b: int = field(default=10, metadata=_range(0, 10_000))
    # source tokens x beam (rows searched) per decoding batch; was decode.batch_tokens (train.batch_tokens counts padded tokens)
    batch_beam_tokens: int = field(default=6000, metadata=_at_least(1))
    # longer input lines are split into segments translated one by one (attention is quadratic in it)
    max_input_tokens: int = field(default=250, metadata=_range(1, 10_000))
    # what translate, evaluate and serve give the model at a time when not told (--split-by, split_by): each sentence
    # of a line (a paragraph cut by the source language's rules, rebuilt with its spacing), or each line whole
    split_by: str = field(default=SplitBy.SENTENCES.value, metadata=_choice(*(choice.value for choice in SplitBy)))


def _one_target_untagged(config: Config) -> str | None:
    """Without language tags the model cannot be told which language to write: one target language only."""
    targets = target_languages(config)
    if config.data.lang_tag == "none" and len(targets) > 1:
        return (
            f"the training corpora translate into {', '.join(targets)}; set data.lang_tag=target so that each source "
            "names its target language, or give every corpus the same tgt_lang"
        )
    return None


def split_languages(config: Config, split: SplitConfig) -> tuple[str, str]:
    """The (source, target) languages of one split: its own, else the recipe's."""
    return split.src_lang or config.src_lang, split.tgt_lang or config.tgt_lang


def direction(config: Config, split: SplitConfig) -> str:
    """How reports name a split's direction: "de-en"."""
    return "-".join(split_languages(config, split))


def target_languages(config: Config) -> list[str]:
    """The languages the model is trained to write (the training corpora's targets), in order of first use."""
    return list(dict.fromkeys(split_languages(config, source)[1] for source in config.data.train))


def recipe_key(data: DataConfig, split: str, *, index: int) -> str:
    """How the recipe names corpus `index` of `split` (train, valid or test) in messages and job keys:
    data.train when the split is one corpus, data.train[i] in a list of several."""
    return f"data.{split}" if len(getattr(data, split)) == 1 else f"data.{split}[{index}]"


def corpus_tags(config: Config) -> list[str]:
    """The corpus tags of the training corpora (`data.train[i].tag`), each once, in recipe order."""
    return list(dict.fromkeys(source.tag for source in config.data.train if source.tag))


def tag_languages(config: Config) -> list[str]:
    """The languages a tagged recipe reserves a tag for, sorted: every split's, the recipe's and data.langs."""
    splits = [*config.data.train, *config.data.valid, *(config.data.test or [])]
    found = {lang for split in splits for lang in split_languages(config, split)}
    return sorted(found | {config.src_lang, config.tgt_lang} | set(_languages(config.data.langs)))


@dataclass(kw_only=True)
class Config:
    """A whole recipe."""

    name: str = field(default="run", metadata=_pattern(r"(?s).*\S.*", "a name that is not blank", "multi30k_transformer"))
    # the languages of the pairs, unless a split of `data` gives its own
    src_lang: str = field(default="src", metadata=_pattern(LANGUAGE, LANGUAGE_RULE, "de"))
    tgt_lang: str = field(default="tgt", metadata=_pattern(LANGUAGE, LANGUAGE_RULE, "fr") | _relation(_one_target_untagged))
    data_dir: str | None = None  # default data/<name>
    run_dir: str | None = None  # default runs/<name>
    # the test BLEU band the recipe should reach, LOW-HIGH; `mtkit evaluate --split test` says if it did
    expected_test_bleu: str = field(
        default="",
        metadata={
            **_pattern(r"|[0-9]+(\.[0-9]+)?-[0-9]+(\.[0-9]+)?", "a band LOW-HIGH of BLEU (or nothing)", "32-39"),
            **_relation(lambda c: None if bleu_band(c) is None or bleu_band(c)[0] < bleu_band(c)[1] else "give LOW < HIGH"),
        },
    )
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir or f"data/{self.name}")

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir or f"runs/{self.name}")


def bleu_band(config: Config) -> tuple[float, float] | None:
    """The recipe's `expected_test_bleu` as (low, high), or None when it states none."""
    if not config.expected_test_bleu:
        return None
    low, high = config.expected_test_bleu.split("-")
    return float(low), float(high)


def choices(section: type, key: str) -> tuple[str, ...]:
    """The values a text key accepts, e.g. `choices(DataConfig, "normalize")` -> ("NFC", "NFKC", "none")."""
    for spec in dataclasses.fields(section):
        if spec.name == key and "choices" in spec.metadata:
            return spec.metadata["choices"]
    raise KeyError(f"{section.__name__}.{key} has no fixed choices")


def arch_keys(arch: str) -> tuple[str, ...]:
    """The `model` keys that architecture `arch` reads (shared and its own), `arch` itself left out.

    They are also the keyword arguments of its constructor.
    """
    return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name != "arch" and f.metadata.get("arch", arch) == arch)


def load_config(path: Path | str, overrides: list[str] | None = None) -> Config:
    """Read a YAML recipe, apply `key.path=value` overrides, and check it against `Config`."""
    path = Path(path)
    if not path.is_file():
        raise MtkitError(f"{path}: recipe not found; give the path of a YAML recipe such as recipes/multi30k/transformer.yaml")
    try:
        raw = parse_yaml(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise MtkitError(f"{path}: not valid YAML ({one_line(err, limit=300)}); fix the recipe file") from None
    if not isinstance(raw, dict):
        raise MtkitError(f"{path}: a recipe must be a mapping of keys to values")
    for item in overrides or []:
        apply_override(raw, item)
    return config_from_dict(inherit_from_parent(raw, str(path)), source=str(path))


def inherit_from_parent(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """A fine-tuning recipe (`train.init_from`) with its parent's `model` and `tokenizer` sections,
    `data.normalize` and `data.lang_tag` filled in; a value of its own that disagrees with the parent is an
    error naming the key."""
    train = raw.get("train")
    init_from = train.get("init_from") if isinstance(train, dict) else None
    if not init_from:
        return raw
    parent = _parent_recipe(Path(str(init_from)), source)
    parent_data = parent.get("data") if isinstance(parent.get("data"), dict) else {}
    inherited = {name: parent.get(name) or {} for name in INHERITED_SECTIONS}
    inherited["data"] = {"normalize": parent_data.get("normalize", "NFC"), "lang_tag": parent_data.get("lang_tag", "none")}
    merged = dict(raw)
    for section, keys in inherited.items():
        own = raw.get(section) or {}
        if not isinstance(own, dict):
            continue  # `_build` names the mistake
        for key, value in own.items():
            if key in keys and value != keys[key] and f"{section}.{key}" not in FREE_WHEN_INHERITED:
                raise MtkitError(
                    f"{source}: '{section}.{key}' is {_show(value)} but the parent model {init_from} has {_show(keys[key])}; "
                    "a fine-tuned model keeps its parent's architecture, vocabulary, normalisation and language tags: "
                    "remove the key"
                )
        merged[section] = {**keys, **own}
    return merged


def _parent_recipe(path: Path, source: str) -> dict[str, Any]:
    """The saved config (config.yaml) of the run directory `path`, or of the run a checkpoint file lies in."""
    saved = RunFiles(path if path.is_dir() else path.parent).config
    if not path.exists():
        raise MtkitError(
            f"{source}: 'train.init_from' is {str(path)!r}, which does not exist; give a run directory or checkpoint"
        )
    try:
        recipe = parse_yaml(saved.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as err:
        raise MtkitError(
            f"{source}: 'train.init_from' {str(path)!r}: cannot read the parent's {saved.name} ({one_line(err)}); "
            "give the run directory of an mtkit run or `mtkit import`"
        ) from None
    if not isinstance(recipe, dict):
        raise MtkitError(f"{saved}: not a saved mtkit config; give the run directory of an mtkit run or `mtkit import`")
    return recipe


def config_from_dict(raw: dict[str, Any], source: str = "config", *, saved: bool = False) -> Config:
    """Build a checked `Config` from plain data (the YAML form).

    `saved=True` reads a config written with a model by any mtkit version: keys of the other
    architecture and retired keys (such as `decode.nbest`) are dropped instead of refused.
    """
    config = _build(Config, raw, prefix="", source=source, saved=saved)
    if not saved:
        _check_across_sections(config, source)
    return config


def _check_across_sections(config: Config, source: str) -> None:
    """The rules between keys of two sections: training levers that act on a Transformer's repeated layers."""
    _check_lora(config, source)
    if config.model.arch != "rnn":
        return
    if config.train.compile == "layers":
        raise MtkitError(f"{source}: 'train.compile' is 'layers'; an RNN has no repeated layers to compile one by one: give true")
    if config.train.checkpoint_activations:
        raise MtkitError(
            f"{source}: 'train.checkpoint_activations' is true; an RNN has no repeated layers to recompute: set it false"
        )


def _check_lora(config: Config, source: str) -> None:
    """What `train.lora` needs (a Transformer parent) and the training keys it cannot go with."""
    train = config.train
    if train.lora is None:
        return
    lora = train.lora
    rules = (
        (not train.init_from, "it adapts a parent: set train.init_from (a run directory, or `mtkit import`'s)"),
        (config.model.arch == "rnn", "it adapts a Transformer's layers; the parent is an RNN: fine-tune it without train.lora"),
        (bool(train.freeze.strip()), "the parent's weights are frozen whole already: remove train.freeze"),
        (train.bf16_weights == "true", "use train.lora.bf16_base for bf16 base weights: remove train.bf16_weights"),
        (bool(train.ema or train.average_last), "train.ema and train.average_last average whole models: set them to 0"),
        (
            train.fused_loss == "true" and "embedding" in lora.targets,
            "train.fused_loss reads the output weight without its adapter: set train.fused_loss=false or drop embedding",
        ),
        (
            lora.bf16_base == "true" and (train.precision in ("fp32", "fp16") or train.device == "cpu"),
            "a bf16 base needs train.precision bf16 on CUDA: set train.lora.bf16_base=auto or false",
        ),
    )
    clash = next((advice for broken, advice in rules if broken), None)
    if clash is not None:
        raise MtkitError(f"{source}: 'train.lora' is set; {clash}")


def _a_folder(setting: str) -> str | None:
    """`train.compile_cache`: auto, false (off) or a folder, never an existing file."""
    if setting in ("auto", "false", "off") or not Path(setting).is_file():
        return None
    return "it is a file: give a folder (made when missing), auto or false"


def config_to_dict(config: Config) -> dict[str, Any]:
    """The plain-data form of a config, as saved with each run: the `model` keys of its architecture only."""
    return _to_dict(config)


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `a.b.c=value` override to plain recipe data; the value is parsed as YAML."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise MtkitError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.max_steps=100")
    try:
        value = parse_yaml(text) if text.strip() else None
    except yaml.YAMLError:  # such as an integer of more than 4300 digits: kept as text
        value = text
    parts = key.strip().split(".")
    node = raw
    for depth, part in enumerate(parts[:-1]):
        node = _override_child(node, part, ".".join(parts[: depth + 1]), key.strip())
    node[parts[-1]] = value


def _override_child(node: dict[str, Any], part: str, path: str, key: str) -> dict[str, Any]:
    """The mapping an override walks into: `train[1]` picks an item of a list, and a list of one its item."""
    name, _, index = part.partition("[")
    child = node.get(name)
    if isinstance(child, dict) and not index:
        return child
    if isinstance(child, list):
        position = int(index[:-1]) if re.fullmatch(r"[0-9]+\]", index) else (0 if not index and len(child) == 1 else None)
        if position is not None and position < len(child) and isinstance(child[position], dict):
            return child[position]
        listed = path.rpartition("[")[0] if index else path
        raise MtkitError(
            f"--set {key}: {listed} is a list of {len(child)}; pick one, e.g. --set {listed}[0].{key.split('.')[-1]}=..."
        )
    node[name] = {}
    return node[name]


def parse_duration(text: str | None) -> float | None:
    """'90m' -> 5400.0 seconds; '2h', '30s' and bare numbers (seconds) also work."""
    if text is None or str(text).strip() == "":
        return None
    match = re.fullmatch(DURATION, str(text))
    if not match:
        raise MtkitError(f"train.max_time={text!r}: expected a duration such as 90m, 2h or 600s")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return float(match.group(1)) * scale


def _build(cls: type, raw: Any, prefix: str, source: str, saved: bool) -> Any:
    """Convert and check one section (recursively): unknown keys, types, architecture, rules."""
    if not isinstance(raw, dict):
        raise MtkitError(f"{source}: '{prefix.rstrip('.') or 'recipe'}' must be a mapping, got {raw!r}")
    fields, hints = _schema(cls)
    values = {}
    for key, value in _renamed(raw, prefix, source, saved).items():
        if key not in fields:
            if saved and f"{prefix}{key}" in RETIRED_KEYS:
                continue
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"valid keys: {', '.join(fields)}"
            raise MtkitError(f"{source}: unknown key '{prefix}{key}'; {hint}")
        values[key] = _convert(hints[key], value, fields[key], f"{prefix}{key}", source, saved)
    section = cls(**values)
    foreign = [key for key in values if not _applies(fields[key], section)]
    if foreign and not saved:
        arch = fields[foreign[0]].metadata["arch"]
        raise MtkitError(
            f"{source}: '{prefix}{foreign[0]}' is {_ARCH_NAMES[arch]} key but {prefix}arch is {section.arch}; "
            f"remove it, or set {prefix}arch={arch}"
        )
    if foreign:  # an older saved config: every key of every architecture
        section = cls(**{key: value for key, value in values.items() if key not in foreign})
    _check_rules(section, prefix, source)
    return section


@functools.cache  # every config a process builds reads the same section classes
def _schema(cls: type) -> tuple[dict[str, dataclasses.Field], dict[str, Any]]:
    """A section class's fields by name, and their types resolved from the annotations' text."""
    return {f.name: f for f in dataclasses.fields(cls)}, typing.get_type_hints(cls)


def _renamed(raw: dict[str, Any], prefix: str, source: str, saved: bool) -> dict[str, Any]:
    """`raw` with renamed keys under their new names; a recipe (not a saved config) is told once per key."""
    renamed = {}
    for key, value in raw.items():
        new = RENAMED_KEYS.get(f"{prefix}{key}")
        if new is None:
            renamed[key] = value
            continue
        if new in raw:
            raise MtkitError(f"{source}: '{prefix}{key}' and '{prefix}{new}' are one key (renamed); keep '{prefix}{new}'")
        if not saved:
            print(f"mtkit: note: {source}: '{prefix}{key}' is now called '{prefix}{new}'; rename it", file=sys.stderr)
        renamed[new] = value
    return renamed


def _convert(hint: Any, value: Any, spec: dataclasses.Field, key: str, source: str, saved: bool) -> Any:
    if typing.get_origin(hint) is list:
        return _convert_list(typing.get_args(hint)[0], value, key, source, saved)
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise MtkitError(f"{source}: '{key}' cannot be empty")
    listed = [option for option in options if typing.get_origin(option) is list]
    if listed:  # a list of sections, or None
        return _convert_list(typing.get_args(listed[0])[0], value, key, source, saved)
    for option in options:
        if dataclasses.is_dataclass(option):
            return _build(option, value, f"{key}.", source, saved)
    expected = next(o for o in options if o is not type(None))
    if expected is bool and isinstance(value, bool):
        return value
    if expected is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if expected is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, int) and abs(value) > 1e308:  # a 400-digit int is no float
            return math.inf if value > 0 else -math.inf
        return float(value)
    if expected is float and isinstance(value, str):
        try:
            return float(value)  # YAML reads 1e-3 (no dot) as a string
        except ValueError:
            pass
    words = spec.metadata.get("choices", spec.metadata.get("words", ()))
    if expected is str and isinstance(value, bool) and str(value).lower() in words:
        return str(value).lower()  # auto/true/false keys (and a free key's false): YAML's true and false, off and on
    if expected is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = str(value)
        choices = spec.metadata.get("choices")
        if choices and value not in choices:
            raise MtkitError(f"{source}: '{key}' is {value!r}; choose one of {', '.join(choices)}")
        return value
    raise MtkitError(f"{source}: '{key}' must be {expected.__name__}, got {value!r}")


def _convert_list(item: type, value: Any, key: str, source: str, saved: bool) -> list[Any]:
    """A list of sections: one mapping is a list of one (its keys keep the plain `key.` prefix).
    A list of text (model paths): one string is a list of one."""
    if item is str:
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not texts or not all(isinstance(text, str) and text for text in texts):
            raise MtkitError(f"{source}: '{key}' must be a path or a non-empty list of paths, got {value!r}")
        return texts
    if isinstance(value, dict):
        return [_build(item, value, f"{key}.", source, saved)]
    if not isinstance(value, list) or not value:
        raise MtkitError(f"{source}: '{key}' must be a mapping or a non-empty list of mappings, got {value!r}")
    return [_build(item, entry, f"{key}[{index}].", source, saved) for index, entry in enumerate(value)]


def _check_rules(section: Any, prefix: str, source: str) -> None:
    """Apply each field's declared range, pattern and relation, in field order, to a built section."""
    for spec in dataclasses.fields(section):
        value = getattr(section, spec.name)
        if value is None or dataclasses.is_dataclass(value) or not _applies(spec, section):
            continue  # a list of sections has only a relation, checked here
        advice = _advice(spec, value, section)
        if advice:
            raise MtkitError(f"{source}: '{prefix}{spec.name}' is {_show(value)}; {advice}")


def _advice(spec: dataclasses.Field, value: Any, section: Any) -> str | None:
    """What to give instead of `value`, or None when it passes the field's rules."""
    rule: Range | None = spec.metadata.get("range")
    if isinstance(value, float) and rule is None:
        rule = Range()  # no NaN or infinity anywhere
    if rule is not None and not rule.admits(value):
        example = spec.default if rule.example is None else rule.example
        return f"give {rule.describe(whole=isinstance(value, int))}, such as {example}"
    pattern: Pattern | None = spec.metadata.get("pattern")
    if pattern is not None and not re.fullmatch(pattern.regex, value):
        return f"give {pattern.description}, such as {pattern.example}"
    relation = spec.metadata.get("relation")
    return relation(section) if relation else None


def _applies(spec: dataclasses.Field, section: Any) -> bool:
    """Whether a key is read by this section: architecture-specific keys only by their `arch`."""
    arch = spec.metadata.get("arch")
    return arch is None or arch == section.arch


def _to_dict(section: Any) -> dict[str, Any]:
    data = {}
    for spec in dataclasses.fields(section):
        if _applies(spec, section):
            data[spec.name] = _plain(getattr(section, spec.name))
    return data


def _plain(value: Any) -> Any:
    if isinstance(value, list) and len(value) == 1:  # a list of one section is written as that mapping
        return _plain(value[0])
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return _to_dict(value) if dataclasses.is_dataclass(value) else value


def _show(value: Any) -> str:
    """A value as the error shows it: YAML's true/false, quoted text, plain numbers."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return repr(value) if isinstance(value, str) else str(value)


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)
