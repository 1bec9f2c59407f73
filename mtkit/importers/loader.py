"""What importing any Hugging Face family needs: the folder (a local one or a hub id downloaded to the cache),
its JSON files and weights, the family that config.json names, the mtkit model holding the weights, and the
run directory written at the end. Each family's module (marian.py, ...) keeps only what is its own.

Everything a folder gives is read as untrusted: files must be regular files of bounded size, config.json's sizes
are whole numbers within bounds and equal to the shapes of the weights (read from the safetensors header, which
costs nothing) before anything is sized from them, and the model is built on the meta device and given the
weights themselves, so an import holds the weights about once."""

from __future__ import annotations

import json
import os
import pickle
import re
import stat
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtkit.config import Config, DecodeConfig, config_from_dict, config_to_dict
from mtkit.data.tokenizer import Tokenizer, TokenizerPair
from mtkit.errors import MtkitError, one_line
from mtkit.importers.names import ACTIVATIONS, SAFETENSORS_DTYPES, TokenizerFamily
from mtkit.models.base import EncoderDecoder
from mtkit.models.checkpoint import checkpoint_payload, model_with_weights, save_checkpoint
from mtkit.run_files import RunFiles
from mtkit.serving.limits import MOST_BEAM

HUB_ID = r"[\w.-]+/[\w.-]+"  # owner/name
ANY_FAMILY = ("Hugging Face", "config.json and the weights", "Helsinki-NLP/opus-mt-de-en")  # title, holds, example
JSON_BYTES = 64 << 20  # the largest JSON file read (NLLB-200's tokenizer.json is 17 MB)
SENTENCEPIECE_BYTES = 64 << 20  # the largest SentencePiece model read (NLLB-200's is 5 MB)
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# config.json's sizes: the smallest and largest mtkit builds (ModelConfig's bounds; the heads at most d_model)
SIZES = {
    "encoder_layers": (1, 1024),
    "decoder_layers": (1, 1024),
    "d_model": (1, 65536),
    "encoder_attention_heads": (1, 65536),
    "encoder_ffn_dim": (1, 1 << 20),
    "max_position_embeddings": (2, 1 << 16),
}
UNFIT = "the weights do not fit config.json"  # the end of every refusal of a size that differs from the weights'
LAYER = re.compile(r"(encoder|decoder)\.layers\.(\d+)\.")


@dataclass(frozen=True, kw_only=True)
class Imported:
    """A family's folder read into mtkit's terms: the run's config, its tokenizers and the model with the weights."""

    config: Config
    tokenizers: TokenizerPair
    model: EncoderDecoder
    generation: dict[str, Any] = field(default_factory=dict)  # generate()'s settings to keep for an export, mtkit's ids


@dataclass(frozen=True, kw_only=True)
class Family:
    """One foreign family: how its config.json names it, what its folder holds, its reader, and what its
    transformers class needs of an export (read by mtkit.exporters, so the two directions cannot drift)."""

    name: str  # `mtkit import NAME`
    title: str  # in messages: "not a folder of a {title} model"
    model_types: tuple[str, ...]  # config.json's model_type values it reads
    architectures: tuple[str, ...]  # config.json's architectures it reads, where model_type is absent
    holds: str  # the files of its folder, in words
    example: str  # a hub id
    hub_files: tuple[str, ...]  # what a hub download fetches (allow_patterns)
    read: Callable[[Path, str], Imported]  # (folder, the run's name) -> the import
    tokenizers: tuple[TokenizerFamily, ...]  # the tokenizer classes its folders hold; the run records which
    model_keys: Mapping[str, Any]  # mtkit model keys every import of it has (how a run imported before the record is known)
    export_keys: Mapping[str, Any]  # config.json keys its class's export always writes (mBART's normalize_before, ...)
    logits_bias: bool  # its class holds an output bias (final_logits_bias)

    @property
    def architecture(self) -> str:
        """The transformers class an export names (config.json's architectures)."""
        return self.architectures[0]

    @property
    def model_type(self) -> str:
        """The model_type an export writes."""
        return self.model_types[0]

    def tokenizer(self, tokenizer_class: object, codes: list[str]) -> TokenizerFamily:
        """The tokenizer class a folder of this family holds: the one its tokenizer_config.json names (a Fast one as
        its slow twin), else the first whose language codes are written as the table's `codes` are (__de__, deu_Latn)."""
        named = str(tokenizer_class or "").removesuffix("Fast")
        for tokenizer in self.tokenizers:
            if tokenizer.class_name == named:
                return tokenizer
        return next((tokenizer for tokenizer in self.tokenizers if all(map(tokenizer.writes, codes))), self.tokenizers[-1])


@dataclass(frozen=True)
class Located:
    """Where a source's files are: the folder, and the hub commit they were downloaded at (None for a local folder)."""

    folder: Path
    commit: str | None


# every error a malformed folder can raise in a family's reader beyond its own checks: one line naming the folder
MALFORMED = (ArithmeticError, AttributeError, LookupError, RuntimeError, TypeError, ValueError)


def import_family(source: str, output: Path, *, family: Family, revision: str | None = None) -> tuple[Config, EncoderDecoder]:
    """`mtkit import FAMILY`: a run directory (best.pt, config.yaml) that every mtkit command accepts."""
    check_output(output)
    located = locate(source, family, revision=revision)
    try:
        imported = family.read(located.folder, output.name or "imported")
    except MALFORMED as err:
        raise MtkitError(
            f"{located.folder}: not a {family.title} model mtkit can read ({type(err).__name__}: {one_line(err)})"
        ) from None
    write_run(imported, output, source=source, commit=located.commit)
    return imported.config, imported.model


def check_output(output: Path) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise MtkitError(f"{output}: exists and is not an empty directory; choose another -o")


def locate(source: str, family: Family | None, *, revision: str | None = None) -> Located:
    """A local folder in the Hugging Face layout, or a hub id downloaded to the cache (at `revision`, else the
    newest): the family's files, or only config.json while the family is not known yet (`family` None)."""
    path = Path(source)
    if path.is_dir():
        if revision is not None:
            raise MtkitError(f"--revision {revision}: only for a hub id; {source} is a local folder")
        return Located(path, None)
    title, holds, example = _words(family)
    if path.exists() or not re.fullmatch(HUB_ID, source):
        raise MtkitError(f"{source}: not a folder of a {title} model; give a folder with {holds}, or a hub id such as {example}")
    try:
        from huggingface_hub import snapshot_download

        revision = _checked_hub_files(source, family, revision)
        folder = Path(
            snapshot_download(source, revision=revision, allow_patterns=list(family.hub_files if family else ("config.json",)))
        )
    except MtkitError:
        raise
    except Exception as err:  # ImportError, offline, unknown repository or revision: one line, whatever the cause
        raise MtkitError(
            f"{source}: could not download it from the Hugging Face Hub ({one_line(err)}); download the model "
            f"elsewhere ({holds}) and pass its folder"
        ) from None
    return Located(folder, folder.name if folder.parent.name == "snapshots" else revision)  # the cache names the commit


def _checked_hub_files(source: str, family: Family | None, revision: str | None) -> str | None:
    """The commit that `revision` names on the hub, once its file list shows weights mtkit reads (sharded ones are
    refused before anything is downloaded); `revision` as it is where the hub cannot be asked (offline: the cache)."""
    if family is None:
        return revision
    from huggingface_hub import model_info

    try:
        info = model_info(source, revision=revision)
    except Exception:  # offline or not reachable: snapshot_download says what it can, from the cache or not
        return revision
    files = {sibling.rfilename for sibling in info.siblings or []}
    _refuse_shards(files, source)
    return info.sha or revision


def _refuse_shards(files: set[str], where: object) -> None:
    """Weights split over shards (an index file and model-0000N-of-0000M.safetensors) are refused by name."""
    index = next((name for name in SHARD_INDEXES if name in files), None)
    if index is not None and "model.safetensors" not in files and "pytorch_model.bin" not in files:
        raise MtkitError(
            f"{where}: sharded weights are not supported ({index} and its shards); merge them into one "
            "model.safetensors (e.g. transformers' save_pretrained(..., max_shard_size='100GB')) and import that folder"
        )


def _words(family: Family | None) -> tuple[str, str, str]:
    """The family's title, the files its folder holds and an example hub id, for messages."""
    return (family.title, family.holds, family.example) if family else ANY_FAMILY


def family_of(settings: dict[str, Any], where: Path, *, families: Mapping[str, Family]) -> Family:
    """The family config.json names: by `model_type`, else by `architectures`; another is one line listing the known."""
    model_type, architectures = settings.get("model_type"), settings.get("architectures") or []
    if not isinstance(model_type, str | None) or not isinstance(architectures, list):
        raise MtkitError(f"{where}: model_type and architectures must be a text and a list; is this a transformers config.json?")
    for family in families.values():
        if model_type in family.model_types or (model_type is None and {*map(str, architectures)} & set(family.architectures)):
            return family
    known = ", ".join(f"{family.name} ({'/'.join(family.model_types)})" for family in families.values())
    named = f"model_type {model_type!r}" if model_type is not None else f"architectures {architectures!r}"
    raise MtkitError(f"{where}: {named} is not a family mtkit imports; the known families (model_type): {known}")


def read_regular(path: Path, family: Family | None, *, limit: int) -> bytes:
    """A regular file's bytes (a link is followed, as the hub cache's into its blobs): a FIFO or a device (a link
    to /dev/zero) is refused before it is read, and a file over `limit` bytes before it is held."""
    try:
        with open(path, "rb", opener=_nonblocking) as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise MtkitError(f"{path}: not a regular file; a model folder holds plain files (or links to them)")
            data = file.read(limit + 1)
    except FileNotFoundError:
        title, holds, _ = _words(family)
        raise MtkitError(f"{path}: missing; a {title} folder holds {holds}") from None
    except OSError as err:
        raise MtkitError(f"{path}: not readable ({one_line(err)})") from None
    if len(data) > limit:
        raise MtkitError(
            f"{path}: larger than {limit >> 20} MB, more than any model's own file of this kind; is it the right file?"
        )
    return data


def _nonblocking(name: str, flags: int) -> int:
    """Open without waiting for a writer: a FIFO would block the open itself, before it can be refused."""
    return os.open(name, flags | os.O_NONBLOCK)


def read_json(path: Path, family: Family | None) -> dict[str, Any]:
    """A JSON object of at most JSON_BYTES, nested no deeper than Python's JSON reader recurses (about a thousand
    levels; NaN and Infinity are read as Python does, and refused where a number is read); a missing file is one line
    saying what the family's folder holds."""
    data = read_regular(path, family, limit=JSON_BYTES)
    try:
        parsed = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise MtkitError(f"{path}: nested too deeply to be a model's JSON file") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise MtkitError(f"{path}: not readable JSON ({one_line(err)})") from None
    if not isinstance(parsed, dict):
        raise MtkitError(f"{path}: expected a JSON object")
    return parsed


def read_optional_json(path: Path, family: Family) -> dict[str, Any]:
    """A JSON object the family's folder may leave out (tokenizer_config.json, generation_config.json): {} then."""
    return read_json(path, family) if path.exists() or path.is_symlink() else {}


def read_sentencepiece(path: Path, family: Family, *, table: list[str]) -> Tokenizer:
    """A tokenizer over the folder's SentencePiece model and the family's piece table; a file that is not a
    SentencePiece model with pieces is one line naming it."""
    proto = read_regular(path, family, limit=SENTENCEPIECE_BYTES)
    try:
        import sentencepiece as spm

        if spm.SentencePieceProcessor(model_proto=proto).get_piece_size() == 0:
            raise RuntimeError("it holds no pieces")
        return Tokenizer(proto, table)
    except RuntimeError as err:
        raise MtkitError(
            f"{path}: not a SentencePiece model ({one_line(err)}); a {family.title} folder holds {family.holds}"
        ) from None


def whole(settings: dict[str, Any], key: str, *, where: Path, default: int | None = None) -> int:
    """config.json's `key`, a whole number (`default` where it is left out; None: it must be there)."""
    value = settings.get(key, default)
    if value is None:
        raise MtkitError(f"{where}: {key} is missing; is this a transformers config.json?")
    if isinstance(value, bool) or not isinstance(value, int):
        raise MtkitError(f"{where}: {key} is {json.dumps(value)[:40]}; give a whole number")
    return value


def _rate(settings: dict[str, Any], key: str, where: Path, default: float) -> float:
    """config.json's dropout rate `key`: a number in [0, 1)."""
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise MtkitError(f"{where}: {key} is {json.dumps(value)[:40]}; give a rate in [0, 1)")
    return float(value)


class Weights(Mapping[str, Tensor]):
    """A checkpoint's floating-point tensors by name (transformers' "model." prefix dropped), their shapes known from
    the file's header; each tensor is read only when asked for, as float32, so that a family's reader holds one of the
    file's tensors at a time beside what it has built. A float32 tensor of a safetensors file is the mapped file
    itself, not a copy: the reader copies what it keeps (it joins or reorders every tensor)."""

    def __init__(self, path: Path, *, shapes: dict[str, tuple[int, ...]], read: Callable[[str], Tensor]) -> None:
        self.path, self._read = path, read
        self._names = {name.removeprefix("model."): name for name in shapes}
        self._shapes = {name.removeprefix("model."): shape for name, shape in shapes.items()}

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The tensor's shape, from the header; None where the file has no such tensor."""
        return self._shapes.get(name)

    def __getitem__(self, name: str) -> Tensor:
        tensor = self._read(self._names[name])
        return tensor if tensor.dtype == torch.float32 else tensor.float()  # a half-precision one: converted, then dropped

    def __contains__(self, name: object) -> bool:
        return name in self._names  # without reading the tensor, as Mapping's own would

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def open_weights(folder: Path) -> Weights:
    """The folder's weights, model.safetensors or else pytorch_model.bin (read weights-only: never code), their
    header read; sharded weights are one line."""
    safetensors, pickled = folder / "model.safetensors", folder / "pytorch_model.bin"
    if safetensors.is_file():
        return _safetensors_weights(safetensors)
    if pickled.is_file():
        return _pickled_weights(pickled)
    _refuse_shards({path.name for path in folder.iterdir()}, folder)
    raise MtkitError(f"{folder}: no model.safetensors or pytorch_model.bin; download the model's weights into it")


def _safetensors_weights(path: Path) -> Weights:
    """A .safetensors file through the `safetensors` library, which caps the header, refuses overlapping ranges and
    holes, and maps the file: each tensor read is a fresh mapping, released with the last tensor that uses it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as file:
            tensors = {name: file.get_slice(name) for name in file.keys()}  # noqa: SIM118 - not a dict
            shapes = {name: tuple(part.get_shape()) for name, part in tensors.items() if part.get_dtype() in SAFETENSORS_DTYPES}
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise MtkitError(f"{path}: not a readable safetensors file ({one_line(err)})") from None

    def read(name: str) -> Tensor:
        try:
            with safe_open(path, framework="pt") as file:
                return file.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError, ValueError) as err:
            raise MtkitError(f"{path}: not a readable safetensors file ({one_line(err)})") from None

    return Weights(path, shapes=shapes, read=read)


def _pickled_weights(path: Path) -> Weights:
    """A pytorch_model.bin, read with `weights_only` (a payload that would run code is refused, not run) and mapped
    where it is in torch's zip format."""
    try:
        with warnings.catch_warnings():  # transformers pickles with protocol 4, which torch.load reads but warns about
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as err:  # weights_only found something that is not a tensor: code, maybe
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        refused = found.group(1) if found else "objects other than tensors"
        raise MtkitError(
            f"{path}: refused: reading it would unpickle {refused}, which can run code; only weights are read "
            "(a model.safetensors holds nothing else)"
        ) from None
    except Exception as err:  # the other reading errors of every kind: one line
        raise MtkitError(f"{path}: not a readable weights file ({one_line(err)})") from None
    if not isinstance(loaded, dict) or not all(isinstance(name, str) and isinstance(t, Tensor) for name, t in loaded.items()):
        raise MtkitError(f"{path}: holds {type(loaded).__name__} of other things than named tensors; expected a state dict")
    floating = {name: tensor for name, tensor in loaded.items() if tensor.is_floating_point()}
    return Weights(path, shapes={name: tuple(tensor.shape) for name, tensor in floating.items()}, read=floating.__getitem__)


def transformer_sizes(settings: dict[str, Any], where: Path, *, activation: str, weights: Weights) -> dict[str, Any]:
    """The `model` keys every Hugging Face encoder-decoder's config.json gives alike (depths, sizes, dropout, the
    activation, `activation` where it names none): whole numbers equal to the weights' shapes and within SIZES,
    checked before anything is sized from them; encoder and decoder sizes that differ are refused by their keys."""
    pairs = (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"))
    for encoder_key, decoder_key in pairs:
        if settings.get(encoder_key) != settings.get(decoder_key):
            raise MtkitError(f"{where}: {encoder_key} and {decoder_key} differ; mtkit's encoder and decoder share them")
    named = settings.get("activation_function", activation)
    if not isinstance(named, str) or named not in ACTIVATIONS:
        raise MtkitError(f"{where}: activation_function={named!r} cannot be represented; mtkit has {', '.join(ACTIVATIONS)}")
    sizes = {key: whole(settings, key, where=where, default=1024 if key == "max_position_embeddings" else None) for key in SIZES}
    check_against_weights(sizes, weights, where=where)
    for key, (low, high) in SIZES.items():
        if not low <= sizes[key] <= high:
            raise MtkitError(f"{where}: {key} {sizes[key]} is outside [{low}, {high}], the sizes mtkit builds")
    if sizes["d_model"] % sizes["encoder_attention_heads"]:
        raise MtkitError(
            f"{where}: encoder_attention_heads {sizes['encoder_attention_heads']} does not divide d_model {sizes['d_model']}"
        )
    return {
        "arch": "transformer",
        "layers": sizes["encoder_layers"],
        "encoder_layers": sizes["encoder_layers"],
        "decoder_layers": sizes["decoder_layers"],
        "d_model": sizes["d_model"],
        "heads": sizes["encoder_attention_heads"],
        "ffn_dim": sizes["encoder_ffn_dim"],
        "dropout": _rate(settings, "dropout", where, 0.1),
        "attention_dropout": _rate(settings, "attention_dropout", where, 0.0),
        "max_positions": sizes["max_position_embeddings"],
        "activation": ACTIVATIONS[named],
    }


def check_against_weights(sizes: dict[str, int], weights: Weights, *, where: Path) -> None:
    """config.json's depths, d_model and feed-forward size against the weights' layers and the shape of the first
    encoder layer's fc1 (ffn_dim, d_model), from the header: one line naming the key and the shape."""
    found: dict[str, set[int]] = {"encoder": set(), "decoder": set()}
    for name in weights:
        if match := LAYER.match(name):
            found[match.group(1)].add(int(match.group(2)))
    for stack, layers in found.items():
        if layers and sizes[f"{stack}_layers"] != len(layers):
            raise MtkitError(
                f"{where}: {stack}_layers {sizes[f'{stack}_layers']}, but the weights hold {len(layers)} {stack} layers "
                f"({stack}.layers.{min(layers)} to {max(layers)}): {UNFIT}"
            )
    shape = weights.shape("encoder.layers.0.fc1.weight")
    for key, dimension in (("encoder_ffn_dim", 0), ("d_model", 1)):
        if shape is not None and (len(shape) != 2 or sizes[key] != shape[dimension]):
            raise MtkitError(
                f"{where}: {key} {sizes[key]}, but the weights' encoder.layers.0.fc1.weight has shape {list(shape)} "
                f"(ffn_dim, d_model): {UNFIT}"
            )


def imported_beam(generation: dict[str, Any], settings: dict[str, Any]) -> int:
    """The run's default beam: generation_config.json's num_beams (else config.json's), at most the most a server's
    request may ask for (MOST_BEAM); DecodeConfig's where neither names a whole number >= 1."""
    beam = generation.get("num_beams", settings.get("num_beams"))
    return min(beam, MOST_BEAM) if isinstance(beam, int) and not isinstance(beam, bool) and beam >= 1 else DecodeConfig().beam


def imported_model(
    config: Config, tokenizers: TokenizerPair, *, state: Callable[[], dict[str, Tensor]], folder: Path
) -> Imported:
    """The import: the run's config checked by the rules every later command applies (before anything is built),
    then the model of its `model` keys holding `state()`, the family's weights in mtkit's names (built on the meta
    device and given those tensors, so nothing is sized from config.json before the weights' shapes agree)."""
    checked = config_from_dict(config_to_dict(config), source=f"{folder} (as mtkit's config)", saved=True)
    try:
        weights = state()
    except (IndexError, RuntimeError, ValueError) as err:  # tensors that cannot be joined or reordered as the config says
        raise MtkitError(f"{UNFIT} ({one_line(err, limit=300)})") from None
    model = model_with_weights(checked.model, tokenizers, weights=weights, mismatch=UNFIT)
    return Imported(config=checked, tokenizers=tokenizers, model=model)


def write_run(imported: Imported, output: Path, *, source: str, commit: str | None = None) -> None:
    """The run directory: best.pt (nothing validated yet: `mtkit evaluate` measures it; where it came from, and the
    hub commit where it was downloaded) and config.yaml."""
    config = imported.config
    config.run_dir = str(output)
    progress = {"step": 0, "best_bleu": -1.0}
    weights = imported.model.state_dict()
    kept = {"generation": imported.generation} if imported.generation else {}
    payload = checkpoint_payload(
        config, imported.tokenizers, weights=weights, progress=progress, imported_from=source, imported_commit=commit, **kept
    )
    files = RunFiles(output)
    save_checkpoint(payload, files.best)
    files.write_config(config_to_dict(config))
