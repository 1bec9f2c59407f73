"""What importing any Hugging Face family needs: the folder (a local one or a hub id downloaded to the cache),
its JSON files and weights, the family that config.json names, the mtkit model holding the weights, and the
run directory written at the end. Each family's module (marian.py, ...) keeps only what is its own."""

from __future__ import annotations

import json
import re
import struct
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtkit.config import Config, ModelConfig, config_to_dict
from mtkit.data.tokenizer import TokenizerPair
from mtkit.errors import MtkitError, one_line
from mtkit.importers.names import ACTIVATIONS, SAFETENSORS_DTYPES
from mtkit.models import build_model
from mtkit.models.base import EncoderDecoder
from mtkit.models.checkpoint import checkpoint_payload, save_checkpoint
from mtkit.run_files import RunFiles

HUB_ID = r"[\w.-]+/[\w.-]+"  # owner/name
ANY_FAMILY = ("Hugging Face", "config.json and the weights", "Helsinki-NLP/opus-mt-de-en")  # title, holds, example


@dataclass(frozen=True, kw_only=True)
class Imported:
    """A family's folder read into mtkit's terms: the run's config, its tokenizers and the model with the weights."""

    config: Config
    tokenizers: TokenizerPair
    model: EncoderDecoder
    generation: dict[str, Any] = field(default_factory=dict)  # generate()'s settings to keep for an export, mtkit's ids


@dataclass(frozen=True, kw_only=True)
class Family:
    """One foreign family: how its config.json names it, what its folder holds, and its reader."""

    name: str  # `mtkit import NAME`
    title: str  # in messages: "not a folder of a {title} model"
    model_types: tuple[str, ...]  # config.json's model_type values it reads
    architectures: tuple[str, ...]  # config.json's architectures it reads, where model_type is absent
    holds: str  # the files of its folder, in words
    example: str  # a hub id
    hub_files: tuple[str, ...]  # what a hub download fetches (allow_patterns)
    read: Callable[[Path, str], Imported]  # (folder, the run's name) -> the import


def import_family(source: str, output: Path, *, family: Family) -> tuple[Config, EncoderDecoder]:
    """`mtkit import FAMILY`: a run directory (best.pt, config.yaml) that every mtkit command accepts."""
    check_output(output)
    folder = locate(source, family)
    imported = family.read(folder, output.name or "imported")
    write_run(imported, output, source=source)
    return imported.config, imported.model


def check_output(output: Path) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise MtkitError(f"{output}: exists and is not an empty directory; choose another -o")


def locate(source: str, family: Family | None) -> Path:
    """A local folder in the Hugging Face layout, or a hub id downloaded to the cache: the family's files,
    or only config.json while the family is not known yet (`family` None)."""
    path = Path(source)
    if path.is_dir():
        return path
    title, holds, example = _words(family)
    if path.exists() or not re.fullmatch(HUB_ID, source):
        raise MtkitError(f"{source}: not a folder of a {title} model; give a folder with {holds}, or a hub id such as {example}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, allow_patterns=list(family.hub_files if family else ("config.json",))))
    except Exception as err:  # ImportError, offline, unknown repository: one line, whatever the cause
        raise MtkitError(
            f"{source}: could not download it from the Hugging Face Hub ({one_line(err)}); download the model "
            f"elsewhere ({holds}) and pass its folder"
        ) from None


def _words(family: Family | None) -> tuple[str, str, str]:
    """The family's title, the files its folder holds and an example hub id, for messages."""
    return (family.title, family.holds, family.example) if family else ANY_FAMILY


def family_of(settings: dict[str, Any], where: Path, *, families: Mapping[str, Family]) -> Family:
    """The family config.json names: by `model_type`, else by `architectures`; another is one line listing the known."""
    model_type, architectures = settings.get("model_type"), settings.get("architectures") or []
    for family in families.values():
        if model_type in family.model_types or (model_type is None and set(architectures) & set(family.architectures)):
            return family
    known = ", ".join(f"{family.name} ({'/'.join(family.model_types)})" for family in families.values())
    named = f"model_type {model_type!r}" if model_type is not None else f"architectures {architectures!r}"
    raise MtkitError(f"{where}: {named} is not a family mtkit imports; the known families (model_type): {known}")


def read_json(path: Path, family: Family | None) -> dict[str, Any]:
    """A JSON object; a missing file is one line saying what the family's folder holds (any family's: None)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        title, holds, _ = _words(family)
        raise MtkitError(f"{path}: missing; a {title} folder holds {holds}") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise MtkitError(f"{path}: not readable JSON ({one_line(err)})") from None
    if not isinstance(data, dict):
        raise MtkitError(f"{path}: expected a JSON object")
    return data


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors as float32, from model.safetensors or else pytorch_model.bin."""
    safetensors, pickled = folder / "model.safetensors", folder / "pytorch_model.bin"
    if safetensors.is_file():
        weights = read_safetensors(safetensors)
    elif pickled.is_file():
        try:
            with warnings.catch_warnings():  # transformers pickles with protocol 4, which torch.load reads but warns about
                warnings.filterwarnings("ignore", message="Detected pickle protocol")
                weights = torch.load(pickled, map_location="cpu", weights_only=True)
        except Exception as err:  # unpickling errors of every kind: one line
            raise MtkitError(f"{pickled}: not a readable weights file ({one_line(err)})") from None
    else:
        raise MtkitError(f"{folder}: no model.safetensors or pytorch_model.bin; download the model's weights into it")
    return {name.removeprefix("model."): tensor.float() for name, tensor in weights.items() if tensor.is_floating_point()}


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """A .safetensors file: an 8-byte little-endian header size, a JSON header, then the raw tensors."""
    data = path.read_bytes()
    try:
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + size])
        base, tensors = 8 + size, {}
        for name, entry in header.items():
            if name == "__metadata__" or entry["dtype"] not in SAFETENSORS_DTYPES:
                continue
            start, end = entry["data_offsets"]
            if not 0 <= start <= end <= len(data) - base:
                raise ValueError(f"{name}'s data lies outside the file")
            raw = bytearray(data[base + start : base + end])
            flat = torch.frombuffer(raw, dtype=SAFETENSORS_DTYPES[entry["dtype"]]) if raw else torch.empty(0)
            tensors[name] = flat.reshape(entry["shape"])
    except (struct.error, ValueError, KeyError, TypeError, RuntimeError) as err:
        raise MtkitError(f"{path}: not a readable safetensors file ({one_line(err)})") from None
    return tensors


def transformer_sizes(settings: dict[str, Any], where: Path, *, activation: str) -> dict[str, Any]:
    """The `model` keys every Hugging Face encoder-decoder's config.json gives alike (depths, sizes, dropout, the
    activation, `activation` where it names none); encoder and decoder sizes that differ are refused by their keys."""
    pairs = (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"))
    for encoder_key, decoder_key in pairs:
        if settings.get(encoder_key) != settings.get(decoder_key):
            raise MtkitError(f"{where}: {encoder_key} and {decoder_key} differ; mtkit's encoder and decoder share them")
    named = str(settings.get("activation_function", activation))
    if named not in ACTIVATIONS:
        raise MtkitError(f"{where}: activation_function={named!r} cannot be represented; mtkit has {', '.join(ACTIVATIONS)}")
    try:
        return {
            "arch": "transformer",
            "layers": int(settings["encoder_layers"]),
            "encoder_layers": int(settings["encoder_layers"]),
            "decoder_layers": int(settings["decoder_layers"]),
            "d_model": int(settings["d_model"]),
            "heads": int(settings["encoder_attention_heads"]),
            "ffn_dim": int(settings["encoder_ffn_dim"]),
            "dropout": float(settings.get("dropout", 0.1)),
            "attention_dropout": float(settings.get("attention_dropout", 0.0)),
            "max_positions": int(settings.get("max_position_embeddings", 1024)),
            "activation": ACTIVATIONS[named],
        }
    except (KeyError, TypeError, ValueError) as err:
        raise MtkitError(f"{where}: {err} is missing or not a number; is this a transformers config.json?") from None


def build_imported(
    model_config: ModelConfig, tokenizers: TokenizerPair, *, state: Callable[[], dict[str, Tensor]]
) -> EncoderDecoder:
    """An mtkit model holding the family's weights, `state()` in mtkit's names (checked by `load_state_dict`,
    strict; a tensor that does not fit while `state` joins them is the same one-line error)."""
    model = build_model(
        model_config, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=tokenizers.joint
    )
    try:
        model.load_state_dict(state())
    except RuntimeError as err:
        raise MtkitError(f"the weights do not fit config.json ({one_line(err, limit=300)})") from None
    return model


def write_run(imported: Imported, output: Path, *, source: str) -> None:
    """The run directory: best.pt (nothing validated yet: `mtkit evaluate` measures it) and config.yaml."""
    config = imported.config
    config.run_dir = str(output)
    progress = {"step": 0, "best_bleu": -1.0}
    weights = imported.model.state_dict()
    kept = {"generation": imported.generation} if imported.generation else {}
    payload = checkpoint_payload(config, imported.tokenizers, weights=weights, progress=progress, imported_from=source, **kept)
    files = RunFiles(output)
    save_checkpoint(payload, files.best)
    files.write_config(config_to_dict(config))
