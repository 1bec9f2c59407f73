"""Typed configuration for every stage: the dataclasses hold every default once.

`load_config(path, overrides)` reads a YAML recipe, applies `section.key=value` overrides and
checks every key and type against the dataclasses; an unknown key is an error naming the closest
valid key. Relative paths in a recipe are taken from the current directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtkit.errors import MtkitError


def _choice(*values: str) -> dict[str, tuple[str, ...]]:
    return {"choices": values}


@dataclass
class SplitConfig:
    """Where one split's sentence pairs come from: exactly one of src+tgt, tsv, jsonl or hf."""

    src: str | None = None  # plain text, one sentence a line (.gz ok)
    tgt: str | None = None
    tsv: str | None = None  # "source<TAB>target" a line (.gz ok)
    jsonl: str | None = None  # {"<src_lang>": .., "<tgt_lang>": ..} or {"translation": {..}} a line
    hf: str | None = None  # Hugging Face dataset name (online) or a save_to_disk directory
    split: str | None = None  # the split of `hf` (train, validation, test, ...)
    limit: int | None = None  # keep only the first N pairs


@dataclass
class DataConfig:
    """Corpora and the cleaning rules applied to the training split."""

    train: SplitConfig = field(default_factory=SplitConfig)
    valid: SplitConfig = field(default_factory=SplitConfig)
    test: SplitConfig | None = None
    normalize: str = field(default="NFC", metadata=_choice("NFC", "NFKC", "none"))
    bad_bytes: str = field(default="error", metadata=_choice("error", "replace"))  # bytes that are not UTF-8
    max_len: int = 250  # drop training pairs with more whitespace tokens than this on a side
    max_ratio: float = 3.0  # drop training pairs whose token-length ratio exceeds this
    dedup: bool = True  # drop repeated (source, target) pairs
    drop_copies: bool = True  # drop pairs whose target equals the source


@dataclass
class TokenizerConfig:
    """SentencePiece settings."""

    type: str = field(default="bpe", metadata=_choice("bpe", "unigram"))
    vocab_size: int = 8000
    joint: bool = True  # one model for both languages (needed for tied embeddings)
    character_coverage: float = 1.0
    max_sentences: int = 2_000_000  # sentences sampled for SentencePiece training


@dataclass
class ModelConfig:
    """Architecture and size. `arch` picks the model; the other keys size it.

    Shared: layers, dropout, tie_embeddings. Transformer: d_model .. max_positions.
    RNN: cell .. input_feed.
    """

    arch: str = field(default="transformer", metadata=_choice("transformer", "rnn"))
    layers: int = 6  # encoder and decoder layers each
    d_model: int = 512
    heads: int = 8
    ffn_dim: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    norm: str = field(default="pre", metadata=_choice("pre", "post"))
    positions: str = field(default="sinusoidal", metadata=_choice("sinusoidal", "learned"))
    tie_embeddings: bool = True  # share source, target and output embeddings (joint vocab)
    max_positions: int = 1024
    cell: str = field(default="lstm", metadata=_choice("lstm", "gru"))
    hidden_size: int = 512  # RNN state size (a bidirectional encoder gives each direction half)
    embed_dim: int = 256  # RNN embedding and readout size
    bidirectional: bool = True  # RNN encoder reads the source both ways
    attention: str = field(default="bahdanau", metadata=_choice("none", "bahdanau", "luong_dot", "luong_general"))
    input_feed: bool = False  # Luong input feeding: the previous attentional vector is a decoder input


@dataclass
class TrainConfig:
    """The training loop: batching, optimiser, schedule, stopping."""

    batch_tokens: int = 4096  # padded tokens per batch (sentences x longest side)
    lr: float = 7e-4  # peak learning rate, reached after warmup
    warmup_steps: int = 4000
    label_smoothing: float = 0.1
    clip_norm: float = 1.0  # 0 disables clipping
    accumulate: int = 1  # batches per update
    max_steps: int = 0  # updates; 0 = no limit
    max_epochs: int = 0  # 0 = no limit
    max_time: str | None = None  # wall-clock limit such as "90m", "2h", "600s"
    validate_every: int = 1000  # updates between validations (and checkpoints)
    valid_beam: int = 1  # beam used to decode the valid set for BLEU
    patience: int = 0  # stop after this many validations without a better BLEU; 0 = never
    log_every: int = 100
    keep: int = 0  # also keep the weights of the last N validations as step_*.pt; 0 = none
    ema: float = 0.0  # decay of an exponential moving average of the weights, written as ema.pt; 0 = off
    max_nonfinite: int = 10  # stop after this many updates in a row with a NaN/inf loss or gradient
    seed: int = 1
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    precision: str = field(default="auto", metadata=_choice("auto", "fp32", "bf16", "fp16"))
    threads: int = 0  # CPU threads for torch; 0 = all cores
    compile: bool = False  # torch.compile the training forward pass (see README "Performance")


@dataclass
class DecodeConfig:
    """Search settings used by translate, evaluate and validation."""

    beam: int = 5
    length_penalty: float = 1.0  # score / length**length_penalty
    max_len_a: float = 1.2  # maximum output length = a * source length + b
    max_len_b: int = 10
    batch_tokens: int = 6000  # source tokens x beam per decoding batch
    max_input_tokens: int = 250  # longer input lines are split into segments translated one by one
    nbest: int = 1


@dataclass
class Config:
    """A whole recipe."""

    name: str = "run"
    src_lang: str = "src"
    tgt_lang: str = "tgt"
    data_dir: str | None = None  # default data/<name>
    run_dir: str | None = None  # default runs/<name>
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


def load_config(path: Path | str, overrides: list[str] | None = None) -> Config:
    """Read a YAML recipe, apply `key.path=value` overrides, and check it against `Config`."""
    path = Path(path)
    if not path.is_file():
        raise MtkitError(f"{path}: recipe not found; give the path of a YAML recipe such as recipes/multi30k/transformer.yaml")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise MtkitError(f"{path}: not valid YAML ({_one_line(err)}); fix the recipe file") from None
    if not isinstance(raw, dict):
        raise MtkitError(f"{path}: a recipe must be a mapping of keys to values")
    for item in overrides or []:
        apply_override(raw, item)
    return config_from_dict(raw, source=str(path))


def config_from_dict(raw: dict[str, Any], source: str = "config") -> Config:
    """Build a checked `Config` from plain data (the YAML form)."""
    config = _build(Config, raw, prefix="", source=source)
    parse_duration(config.train.max_time)  # a bad duration fails now, not after loading data
    if not 0.0 <= config.train.ema < 1.0:
        raise MtkitError(f"{source}: 'train.ema' is {config.train.ema}; give a decay in [0, 1) such as 0.999, or 0 for none")
    return config


def config_to_dict(config: Config) -> dict[str, Any]:
    """The plain-data form of a config, as saved with each run."""
    return dataclasses.asdict(config)


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `a.b.c=value` override to plain recipe data; the value is parsed as YAML."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise MtkitError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.max_steps=100")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def parse_duration(text: str | None) -> float | None:
    """'90m' -> 5400.0 seconds; '2h', '30s' and bare numbers (seconds) also work."""
    if text is None or str(text).strip() == "":
        return None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*", str(text))
    if not match:
        raise MtkitError(f"train.max_time={text!r}: expected a duration such as 90m, 2h or 600s")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return float(match.group(1)) * scale


def _build(cls: type, raw: Any, prefix: str, source: str) -> Any:
    if not isinstance(raw, dict):
        raise MtkitError(f"{source}: '{prefix.rstrip('.') or 'recipe'}' must be a mapping, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in raw.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"valid keys: {', '.join(fields)}"
            raise MtkitError(f"{source}: unknown key '{prefix}{key}'; {hint}")
        values[key] = _convert(hints[key], value, fields[key], f"{prefix}{key}", source)
    return cls(**values)


def _convert(hint: Any, value: Any, spec: dataclasses.Field, key: str, source: str) -> Any:
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise MtkitError(f"{source}: '{key}' cannot be empty")
    for option in options:
        if dataclasses.is_dataclass(option):
            return _build(option, value, f"{key}.", source)
    expected = next(o for o in options if o is not type(None))
    if expected is bool and isinstance(value, bool):
        return value
    if expected is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if expected is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if expected is float and isinstance(value, str):
        try:
            return float(value)  # YAML reads 1e-3 (no dot) as a string
        except ValueError:
            pass
    if expected is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = str(value)
        choices = spec.metadata.get("choices")
        if choices and value not in choices:
            raise MtkitError(f"{source}: '{key}' is {value!r}; choose one of {', '.join(choices)}")
        return value
    raise MtkitError(f"{source}: '{key}' must be {expected.__name__}, got {value!r}")


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
