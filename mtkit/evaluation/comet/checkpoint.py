"""A COMET checkpoint as Unbabel publishes it: a folder with hparams.yaml and checkpoints/model.ckpt (or a hub id
that names one), its hyper-parameters checked, and its weights read without unpickling arbitrary objects.

The checkpoint is untrusted input: `torch.load(weights_only=True)` builds only tensors and plain containers. A
pytorch-lightning checkpoint may also pickle lightning's own dictionary classes (`AttributeDict`) around the
hyper-parameters; those few names are read as plain dictionaries without importing lightning, and any other
object refuses the file in one line.
"""

from __future__ import annotations

import re
import reprlib
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from mtkit.errors import MtkitError, one_line
from mtkit.evaluation.comet.layers import ACTIVATIONS
from mtkit.textio import parse_yaml

HPARAMS = "hparams.yaml"
CHECKPOINT = Path("checkpoints") / "model.ckpt"
CLASSES = ("regression_metric", "referenceless_regression_metric", "unified_metric")
REFERENCE_FREE = ("referenceless_regression_metric", "unified_metric")  # unified: unless its inputs are [mt, ref]
SEGMENTS = (["mt", "src"], ["mt", "ref"], ["mt", "src", "ref"])  # a unified model's inputs, joined in this order
POOLING = ("avg", "max", "cls", "default")  # "default": <s> of the last layer
DEFAULT_HIDDEN_SIZES = (3072, 1024)  # unbabel-comet's estimator widths, where hparams.yaml gives none
MAX_ESTIMATOR_LAYERS = 16  # unbabel-comet's estimators have two or three
MAX_WIDTH = 1 << 20  # far above any trained estimator's; keeps the sizes of a build on the meta device within int64
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Containers lightning pickles around the hyper-parameters: read as dicts, never imported.
_PLAIN_DICTS = (
    "pytorch_lightning.utilities.parsing.AttributeDict",
    "lightning_fabric.utilities.data.AttributeDict",
    "lightning.fabric.utilities.data.AttributeDict",
    "lightning.pytorch.utilities.parsing.AttributeDict",
)


class _PlainDict:
    """What an allowed lightning dictionary class becomes when a checkpoint is read: a plain dict (the only
    mapping torch's weights-only reader fills)."""

    def __new__(cls, *args: object) -> dict:  # type: ignore[misc]
        return {}


@dataclass(frozen=True, kw_only=True)
class CometCheckpoint:
    """A COMET folder's hyper-parameters and the path of its weights; `name` is how the user named it."""

    name: str
    folder: Path
    hparams: dict

    @property
    def class_identifier(self) -> str:
        return self.hparams["class_identifier"]

    @property
    def needs_references(self) -> bool:
        """Whether it scores against a reference (COMET) or from the source alone (COMET-QE)."""
        if self.class_identifier == "unified_metric":
            return self.input_segments == ["mt", "ref"]
        return self.class_identifier not in REFERENCE_FREE

    @property
    def hidden_sizes(self) -> list[int]:
        """The estimator's layer widths (unbabel-comet's where hparams.yaml gives none)."""
        return list(self.hparams.get("hidden_sizes", DEFAULT_HIDDEN_SIZES))

    @property
    def input_segments(self) -> list[str]:
        """What a unified model joins into one input (unbabel-comet's default: all three)."""
        return list(self.hparams.get("input_segments", SEGMENTS[-1]))

    def weights(self) -> dict[str, torch.Tensor]:
        """The checkpoint's state_dict, read safely."""
        return read_state_dict(self.folder / CHECKPOINT)


def find_checkpoint(model: str) -> CometCheckpoint:
    """The COMET folder `model` names: a local folder, or a hub id (downloaded once into the hub's cache)."""
    folder = Path(model).expanduser()
    if not folder.exists():
        if not _HUB_ID.match(model):
            raise MtkitError(f"--comet-model {model}: no such folder; give a COMET folder (with {HPARAMS} and {CHECKPOINT})")
        folder = _download(model)
    if not folder.is_dir() or not (folder / HPARAMS).is_file() or not (folder / CHECKPOINT).is_file():
        raise MtkitError(
            f"--comet-model {model}: not a COMET folder; it needs {HPARAMS} and {CHECKPOINT} (as Unbabel publishes them)"
        )
    return CometCheckpoint(name=model, folder=folder, hparams=_read_hparams(folder / HPARAMS))


def _download(hub_id: str) -> Path:
    """The hub model's hparams.yaml and checkpoint, fetched (or found in the cache) by huggingface_hub."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise MtkitError(f"--comet-model {hub_id}: downloading needs huggingface_hub: pip install 'mtkit[comet]'") from None
    try:
        return Path(snapshot_download(hub_id, allow_patterns=[HPARAMS, str(CHECKPOINT)]))
    except Exception as err:  # offline, unknown, gated (CometKiwi asks to accept its licence): one line
        raise MtkitError(
            f"--comet-model {hub_id}: not found locally and not downloadable ({one_line(err, 120)}); "
            "download the folder once (huggingface-cli download ...) and give its path"
        ) from None


def _read_hparams(path: Path) -> dict:
    try:
        hparams = parse_yaml(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise MtkitError(f"{path}: not readable YAML ({one_line(err)})") from None
    if not isinstance(hparams, dict) or hparams.get("class_identifier") not in CLASSES:
        found = hparams.get("class_identifier") if isinstance(hparams, dict) else None
        raise MtkitError(f"{path}: class_identifier {found!r} is not one mtkit scores with; it reads {', '.join(CLASSES)}")
    if hparams.get("encoder_model", "XLM-RoBERTa") != "XLM-RoBERTa":
        raise MtkitError(f"{path}: encoder_model {hparams['encoder_model']!r}: mtkit reads COMET models over XLM-RoBERTa only")
    _check_estimator(path, hparams)
    _check_inputs(path, hparams)
    return hparams


def _check_estimator(path: Path, hparams: dict) -> None:
    """The estimator's widths and activations, by type and bound, before anything is built from them; the
    checkpoint's shapes are compared with the widths before anything is allocated (scorer.py)."""
    sizes = hparams.get("hidden_sizes", list(DEFAULT_HIDDEN_SIZES))
    if not isinstance(sizes, list) or not 1 <= len(sizes) <= MAX_ESTIMATOR_LAYERS or not all(map(_is_width, sizes)):
        raise MtkitError(
            f"{path}: hidden_sizes {reprlib.repr(sizes)}: give the estimator's layer widths as a list of 1 to "
            f"{MAX_ESTIMATOR_LAYERS} whole numbers from 1 to {MAX_WIDTH}, as trained (such as [3072, 1024])"
        )
    for key, default, optional in (("activations", "Tanh", False), ("final_activation", None, True)):
        name = hparams.get(key, default)
        if name is None and optional:
            continue
        if not isinstance(name, str) or name.title() not in ACTIVATIONS:
            raise MtkitError(
                f"{path}: {key} {reprlib.repr(name)} is not an activation mtkit builds; give one of "
                f"{', '.join(ACTIVATIONS)}{' (or null for none)' if optional else ''}"
            )


def _is_width(size: object) -> bool:
    return isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_WIDTH


def _check_inputs(path: Path, hparams: dict) -> None:
    """How sentences are pooled (regression classes) and which segments are joined (unified), as the scorer reads them."""
    if hparams["class_identifier"] == "unified_metric":
        segments = hparams.get("input_segments", SEGMENTS[-1])
        if segments not in SEGMENTS:
            raise MtkitError(f"{path}: input_segments {reprlib.repr(segments)}: give one of {', '.join(map(str, SEGMENTS))}")
    elif hparams.get("pool", "avg") not in POOLING:
        raise MtkitError(f"{path}: pool {reprlib.repr(hparams['pool'])}: give one of {', '.join(POOLING)}, as trained")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A lightning checkpoint's `state_dict` (or a bare state dict), with no arbitrary object unpickled."""
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception as err:  # not a zip checkpoint, truncated, ...
        raise MtkitError(f"{path}: not a readable PyTorch checkpoint ({one_line(err)})") from None
    refused = [name for name in unsafe if name not in _PLAIN_DICTS]
    if refused:
        raise MtkitError(
            f"{path}: refused: reading it would unpickle {', '.join(refused[:3])}, which weights do not need; "
            "re-save its state_dict alone (torch.save(ckpt['state_dict'], ...)) from a source you trust"
        )
    try:
        with torch.serialization.safe_globals([(_PlainDict, name) for name in unsafe]):
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:
        raise MtkitError(f"{path}: not a readable PyTorch checkpoint ({one_line(err)})") from None
    weights = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else None
    if not isinstance(weights, dict) or not all(isinstance(value, torch.Tensor) for value in weights.values()):
        raise MtkitError(f"{path}: holds no state_dict of tensors; not a COMET checkpoint")
    return weights
