"""CometScorer: a COMET checkpoint loaded over transformers' XLM-R encoder, scoring sentences in length-sorted batches.

Published checkpoints name their encoder by hub id (hparams' pretrained_model: xlm-roberta-large,
microsoft/infoxlm-large); its config.json and tokenizer come from `CometOptions.encoder` (`--comet-encoder DIR`)
where given, else from the hub's cache (downloaded once). The encoder's weights are the checkpoint's own.
"""

from __future__ import annotations

import reprlib
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from mtkit.errors import MtkitError, one_line
from mtkit.evaluation.comet.checkpoint import HPARAMS, CometCheckpoint, find_checkpoint
from mtkit.evaluation.comet.models import CometModel, ReferencelessRegression, RegressionMetric, UnifiedMetric
from mtkit.evaluation.comet.options import CometOptions
from mtkit.runtime import resolve_device

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
DEFAULT_ENCODER = "xlm-roberta-large"  # unbabel-comet's, where hparams.yaml names none
MAX_ENCODER_LAYERS = 128  # XLM-R XXL has 48


class CometScorer:
    """Scores translations with one COMET checkpoint; `needs_references` says whether it is COMET or COMET-QE."""

    def __init__(self, checkpoint: CometCheckpoint, model: CometModel, *, tokenizer: Any, options: CometOptions) -> None:
        self.checkpoint, self.model, self.tokenizer, self.options = checkpoint, model, tokenizer, options
        self.max_length = model.encoder.config.max_position_embeddings - 4  # unbabel-comet's truncation

    @classmethod
    def load(cls, options: CometOptions) -> CometScorer:
        """The checkpoint found, its encoder built from config (weights from the checkpoint), on the device."""
        if options.precision not in PRECISIONS:
            raise MtkitError(f"--comet-precision {options.precision}: give fp32 or bf16")
        checkpoint = find_checkpoint(options.model)
        config, tokenizer = _encoder_parts(checkpoint, options.encoder)
        origin = _config_json(checkpoint, options.encoder)
        _check_encoder(checkpoint, config, origin=origin)
        saved = {name.replace("encoder.model.", "encoder.", 1): tensor for name, tensor in checkpoint.weights().items()}
        _check_shapes(checkpoint, config=config, tokenizer=tokenizer, saved=saved, origin=origin)  # nothing allocated yet
        model = _build(checkpoint, config, tokenizer)
        model.load_state_dict({name: saved[name] for name in model.state_dict()})
        device = resolve_device(options.device)
        model.to(device=device, dtype=PRECISIONS[options.precision]).eval()
        return cls(checkpoint, model, tokenizer=tokenizer, options=options)

    @property
    def needs_references(self) -> bool:
        return self.checkpoint.needs_references

    @property
    def signature(self) -> str:
        """What reproduces the score, in sacrebleu's style: the model, mtkit's version, the precision."""
        return f"model:{self.checkpoint.name}|scorer:mtkit-{_mtkit_version()}|precision:{self.options.precision}"

    def score(
        self, sources: list[str], translations: list[str], *, references: list[str] | None = None, progress: bool = False
    ) -> list[float]:
        """One score per translation, in input order; a bar on stderr when `progress` and a terminal."""
        if self.needs_references and references is None:
            raise MtkitError(f"--comet-model {self.checkpoint.name} scores against references: give --ref FILE")
        if not translations:
            return []  # the tokenizer has no batch to make of nothing
        src, mt = self._ids(sources), self._ids(translations)
        ref = self._ids(references) if references is not None else None
        order = sorted(range(len(mt)), key=lambda i: len(src[i]) + len(mt[i]))  # less padding
        scores = [0.0] * len(mt)
        bar = tqdm(total=len(mt), unit=" sent", desc="COMET", disable=None if progress else True, file=sys.stderr)
        with torch.inference_mode():
            for start in range(0, len(order), self.options.batch_size):
                rows = order[start : start + self.options.batch_size]
                batch_ref = [ref[i] for i in rows] if ref is not None else None
                found = self.model([src[i] for i in rows], [mt[i] for i in rows], batch_ref).float().tolist()
                for row, value in zip(rows, found, strict=True):
                    scores[row] = value
                bar.update(len(rows))
        bar.close()
        return scores

    def _ids(self, lines: list[str]) -> list[list[int]]:
        return self.tokenizer(lines, truncation=True, max_length=self.max_length)["input_ids"]


def _mtkit_version() -> str:
    try:
        return version("mtkit")
    except PackageNotFoundError:
        return "dev"


def _encoder_parts(checkpoint: CometCheckpoint, folder: Path | None) -> tuple[Any, Any]:
    """The encoder's XLMRobertaConfig and tokenizer, from `folder` or from the hub id the hparams name."""
    try:
        from transformers import XLMRobertaConfig, XLMRobertaTokenizerFast
    except ImportError:
        raise MtkitError("COMET scoring needs transformers: pip install 'mtkit[comet]'") from None
    name = checkpoint.hparams.get("pretrained_model", DEFAULT_ENCODER)
    if folder is not None and not (folder / "config.json").is_file():
        raise MtkitError(f"--comet-encoder {folder}: no config.json there; give the folder of the encoder {name}")
    source = str(folder) if folder is not None else name
    try:
        return XLMRobertaConfig.from_pretrained(source), XLMRobertaTokenizerFast.from_pretrained(source)
    except Exception as err:  # offline without a cache, no tokenizer files: one line
        raise MtkitError(
            f"--comet-model {checkpoint.name}: its encoder {name}'s config and tokenizer could not be read from {source} "
            f"({one_line(err, 100)}); give --comet-encoder DIR, a folder with {name}'s config.json and tokenizer files"
        ) from None


def _check_encoder(checkpoint: CometCheckpoint, config: Any, *, origin: str) -> None:
    """The encoder's depth bounded (a model is built layer by layer, even on the meta device) and the layer the
    hparams score from one of its layers."""
    layers = config.num_hidden_layers
    if not 1 <= layers <= MAX_ENCODER_LAYERS:
        raise MtkitError(
            f"{origin}: num_hidden_layers {layers}: an XLM-R encoder has 1 to {MAX_ENCODER_LAYERS}; "
            "give --comet-encoder the folder of the encoder the model was trained on"
        )
    key = "sent_layer" if checkpoint.class_identifier == "unified_metric" else "layer"
    layer = checkpoint.hparams.get(key, "mix")
    if layer != "mix" and (not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer <= layers):
        raise MtkitError(
            f"{checkpoint.folder / HPARAMS}: {key} {reprlib.repr(layer)}: give mix or one of the encoder's layers, "
            f"0 (its embeddings) to {layers}"
        )


def _check_shapes(checkpoint: CometCheckpoint, *, config: Any, tokenizer: Any, saved: dict[str, Tensor], origin: str) -> None:
    """The model built on the meta device (shapes without memory) and compared with the checkpoint's tensors,
    which are memory-mapped: sizes in hparams.yaml or config.json that the checkpoint does not hold are one line."""
    try:
        with torch.device("meta"):
            wanted = _build(checkpoint, config, tokenizer).state_dict()
    except (ValueError, RuntimeError, TypeError, ZeroDivisionError) as err:  # heads that do not divide the width, ...
        raise MtkitError(
            f"{origin}: does not describe an XLM-R encoder ({one_line(err, 100)}); "
            "give --comet-encoder the folder of the encoder the model was trained on"
        ) from None
    for name, tensor in wanted.items():
        found = saved.get(name)
        if found is not None and found.shape == tensor.shape:
            continue
        problem = f"lacks {name}" if found is None else f"has {name} of shape {tuple(found.shape)}"
        if name.startswith("estimator."):
            raise MtkitError(
                f"{checkpoint.folder / HPARAMS}: its checkpoint {problem}, unlike hidden_sizes {checkpoint.hidden_sizes} of a "
                f"{checkpoint.class_identifier}; give the widths the checkpoint was trained with"
            )
        raise MtkitError(
            f"--comet-model {checkpoint.name}: its checkpoint {problem}, unlike a {checkpoint.class_identifier} over the "
            f"encoder config given ({origin}); check --comet-encoder names the encoder the "
            "model was trained on"
        )


def _config_json(checkpoint: CometCheckpoint, folder: Path | None) -> str:
    """Where the encoder's config.json was read, for messages."""
    name = checkpoint.hparams.get("pretrained_model", DEFAULT_ENCODER)
    return str(folder / "config.json") if folder is not None else f"{name}'s config.json"


def _build(checkpoint: CometCheckpoint, config: Any, tokenizer: Any) -> CometModel:
    """The checkpoint's class, with the shapes and choices its hparams.yaml records (checked by `_check_shapes`)."""
    from transformers import XLMRobertaModel

    hparams = checkpoint.hparams
    common = {
        "num_layers": config.num_hidden_layers + 1,
        "hidden_size": config.hidden_size,
        "layer_norm": bool(hparams.get("layer_norm", False)),
        "transformation": hparams.get("layer_transformation", "softmax"),
        "pad_id": tokenizer.pad_token_id,
        "hidden_sizes": checkpoint.hidden_sizes,
        "activation": hparams.get("activations", "Tanh"),
        "final_activation": hparams.get("final_activation"),
    }
    encoder = XLMRobertaModel(config, add_pooling_layer=False)
    if checkpoint.class_identifier == "unified_metric":
        return UnifiedMetric(
            encoder, layer=hparams.get("sent_layer", "mix"), special_ids=(tokenizer.cls_token_id, tokenizer.sep_token_id),
            max_positions=config.max_position_embeddings - 2, segments=checkpoint.input_segments, **common,
        )  # fmt: skip
    kind = RegressionMetric if checkpoint.class_identifier == "regression_metric" else ReferencelessRegression
    return kind(encoder, layer=hparams.get("layer", "mix"), pooling=hparams.get("pool", "avg"), **common)
