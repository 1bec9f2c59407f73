"""Self-describing checkpoints: atomic writes and safe loading (which file `-m RUN` means: `mtkit.run_files`).

A checkpoint holds the resolved config, both SentencePiece models, the weights and the training
position, so `mtkit translate -m RUN_DIR` needs nothing else, but for a LoRA run's (`train.lora`): its weights
are the adapters alone, and `LORA_PARENT` names the parent's checkpoint and the digest of its weights, which
`load_model` builds, checks and adapts (`merge_run` writes the merged model as a plain run). `last.pt` also holds
the optimiser and scheduler for `--resume`; `best.pt` holds the weights with the best validation score (BLEU, or
the COMET of `train.validate_metric`).
Files are loaded with `torch.load(weights_only=True)`: a checkpoint can never run code.
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtkit.config import Config, ModelConfig, config_from_dict, config_to_dict
from mtkit.data.tokenizer import Tokenizer, TokenizerPair
from mtkit.errors import MtkitError, one_line
from mtkit.models import build_model
from mtkit.models.base import EncoderDecoder
from mtkit.models.layers import SinusoidalPositions
from mtkit.models.lora import apply_lora, load_adapters, merge_lora, weights_digest
from mtkit.run_files import RunFiles, checkpoint_file
from mtkit.textio import atomic_file

FORMAT = "mtkit-checkpoint-1"
LORA_PARENT = "lora_parent"  # a LoRA run's record of its parent: {"path": its checkpoint, "weights_sha256": ...}
TRAINING_STATE = ("optimizer", "scheduler", "rng", "scaler", "ema")  # what last.pt adds for --resume


def save_checkpoint(payload: dict[str, Any], path: Path) -> None:
    """Write a checkpoint through mtkit's one atomic writer (`textio.atomic_file`), creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, binary=True) as file:
        torch.save(payload, file)


def checkpoint_payload(
    config: Config, tokenizers: TokenizerPair, *, weights: dict[str, torch.Tensor], **extra: Any
) -> dict[str, Any]:
    """What every checkpoint holds: format marker, config, tokenizers and the model's state dict."""
    return {
        "format": FORMAT,
        "config": config_to_dict(config),
        "tokenizers": tokenizer_payload(tokenizers),
        "model": weights,
        **extra,
    }


def tokenizer_payload(tokenizers: TokenizerPair) -> dict[str, Any]:
    """The tokenizers as a checkpoint holds them: both SentencePiece models, and piece tables where they have them."""
    held: dict[str, Any] = {"src": tokenizers.src.model_proto, "tgt": tokenizers.tgt.model_proto}
    for side, tokenizer in (("src", tokenizers.src), ("tgt", tokenizers.tgt)):
        if tokenizer.table is not None:
            held[f"{side}_pieces"] = tokenizer.table
    return held


def checkpoint_tokenizers(payload: dict[str, Any]) -> TokenizerPair:
    """The tokenizers a checkpoint holds."""
    held = payload["tokenizers"]
    return TokenizerPair.of(Tokenizer(held["src"], held.get("src_pieces")), Tokenizer(held["tgt"], held.get("tgt_pieces")))


def resolve_checkpoint(path: Path) -> Path:
    """The checkpoint file `-m path` means: a file as it is; of a run directory, the weights
    `RunFiles.chosen_weights` chooses (its best-validated final checkpoint), by the score read here."""
    return checkpoint_file(path, validated_score)


def validated_score(path: Path) -> float | None:
    """The validation score a run's checkpoint records, by the metric that chose its best.pt (the progress'
    `metric`: BLEU in runs without one): best.pt the best of its run; an end-of-training average.pt or ema.pt
    its own, valid_bleu or valid_comet (None until the end of training has validated it)."""
    payload = read_checkpoint(path, mmap=True)  # the weights stay on disk: only the records are read
    progress = payload["progress"]
    metric = progress.get("metric", "bleu")
    if path == RunFiles.of(path).best:
        return progress["best_bleu"] if metric == "bleu" else progress.get("best_score")
    return payload.get(f"valid_{metric}")


def read_checkpoint(path: Path, *, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint file safely (no arbitrary unpickling); with `mmap`, its tensors are mapped from the file
    and read only when used."""
    path = resolve_checkpoint(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise MtkitError(
            f"{path}: refused to load: the file contains objects other than weights and plain data "
            f"(possibly code); only load checkpoints written by mtkit ({one_line(err)})"
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        raise MtkitError(f"{path}: not a readable checkpoint ({one_line(err)})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise MtkitError(f"{path}: not an mtkit checkpoint (missing format marker {FORMAT!r})")
    return payload


def load_model(path: Path, *, merged: bool = False) -> tuple[EncoderDecoder, Config, TokenizerPair, dict[str, Any]]:
    """Rebuild the model, config and tokenizers from a checkpoint or run directory. A LoRA run's model is its parent
    with the adapters applied (its payload with the parent's records it lacks, such as an import's); `merged`: folded
    into the weights (`merge_lora`), as the exporters write it."""
    payload = read_checkpoint(path)
    config = config_from_dict(payload["config"], source=str(path), saved=True)
    tokenizers = checkpoint_tokenizers(payload)
    weights = payload["model"]
    if not isinstance(weights, dict) or not all(isinstance(tensor, Tensor) for tensor in weights.values()):
        raise MtkitError(f"{resolve_checkpoint(path)}: its model is not a state dict of tensors; not an mtkit checkpoint")
    mismatch = f"{resolve_checkpoint(path)}: the weights do not fit the checkpoint's own config"
    if LORA_PARENT not in payload:
        return model_with_weights(config.model, tokenizers, weights=weights, mismatch=mismatch), config, tokenizers, payload
    model, parent_payload = _adapted_parent(path, payload, config=config)
    load_adapters(model, weights, mismatch=f"{resolve_checkpoint(path)}: the adapters do not fit its train.lora")
    if merged:
        merge_lora(model)
    return model, config, tokenizers, {**parent_payload, "model": weights, **payload}


def _adapted_parent(path: Path, payload: dict[str, Any], *, config: Config) -> tuple[EncoderDecoder, dict[str, Any]]:
    """A LoRA run's parent model, its weights checked against the digest the run recorded, with `config.train.lora`'s
    adapters added (as initialised: the run's are loaded next); and the parent's payload."""
    record = payload[LORA_PARENT]
    if config.train.lora is None:
        raise MtkitError(f"{resolve_checkpoint(path)}: it names a LoRA parent but its config has no train.lora")
    parent, named = Path(record["path"]), Path(config.train.init_from or record["path"])
    if not parent.is_file() and named.exists():  # moved with the project: its train.init_from, from here
        parent = resolve_checkpoint(named)
    if not parent.is_file():
        raise MtkitError(
            f"{resolve_checkpoint(path)}: a LoRA run, whose parent {record['path']} is gone (nor is its train.init_from "
            f"{named} here); put it back, or give the run that was merged from it (mtkit merge)"
        )
    model, _, _, parent_payload = load_model(parent)
    check_parent(weights_digest(parent_payload["model"]), record, child=resolve_checkpoint(path))
    apply_lora(model, config.train.lora)
    return model, {key: value for key, value in parent_payload.items() if key not in TRAINING_STATE}


def parent_record(checkpoint: Path, weights: dict[str, Tensor]) -> dict[str, str]:
    """What a LoRA run records of the parent checkpoint it adapts, whose `weights` these are."""
    return {"path": str(resolve_checkpoint(checkpoint).resolve()), "weights_sha256": weights_digest(weights)}


def check_parent(digest: str, record: dict[str, str], *, child: Path) -> None:
    """Refuse, in one line, a parent whose weights (their `weights_digest`) are not those `child`'s adapters were
    trained on."""
    if digest != record["weights_sha256"]:
        raise MtkitError(
            f"{child}: the weights of its LoRA parent {record['path']} changed since the adapters were trained on them "
            f"(sha256 {record['weights_sha256'][:12]}...); put the parent's checkpoint back as it was"
        )


def merge_run(path: Path, output: Path) -> Path:
    """`mtkit merge`: a LoRA run's model with its adapters folded into its weights, written as a plain run directory
    (best.pt and config.yaml, without train.lora) that every command reads without the parent; the checkpoint written."""
    files = RunFiles(output)
    if files.best.exists() or files.last.exists():
        raise MtkitError(f"-o {output}: already holds a run; give a new directory")
    if LORA_PARENT not in read_checkpoint(path, mmap=True):
        raise MtkitError(f"{resolve_checkpoint(path)}: not a LoRA run (no adapters to merge); use it as it is")
    model, config, tokenizers, payload = load_model(path, merged=True)
    plain = dataclasses.replace(config, run_dir=str(output), train=dataclasses.replace(config.train, lora=None))
    own = (*TRAINING_STATE, LORA_PARENT, "format", "config", "tokenizers", "model")  # written anew, or not at all
    kept = {key: value for key, value in payload.items() if key not in own}
    merged = checkpoint_payload(plain, tokenizers, weights=model.state_dict(), **kept, merged_from=str(path))
    save_checkpoint(merged, files.best)
    files.write_config(config_to_dict(plain))
    return files.best


def model_with_weights(
    config: ModelConfig, tokenizers: TokenizerPair, *, weights: dict[str, Tensor], mismatch: str
) -> EncoderDecoder:
    """The model of `config` holding `weights` themselves, nothing sized from the config before it is compared with
    the weights: built on the meta device (free at any size), its tensors compared by name and shape with `weights`
    (one line, `mismatch` and the first that differs), then given them in place of its own: no random
    initialisation and no copy but of a tensor that is a view of something larger (a mapped file) or of another dtype.
    Tied parameters stay tied; the sinusoid tables, derived and never saved, are computed once the sizes are known."""
    with torch.device("meta"):
        model = build_model(
            config, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=tokenizers.joint
        )
    expected = model.state_dict()
    _check_fit(expected, weights, mismatch)
    tied = [names for names in _parameter_names(model).values() if len(names) > 1]
    model.load_state_dict({name: _owned(weights[name], expected[name].dtype) for name in expected}, assign=True)
    for first, *others in tied:  # `assign` gave each name a parameter of its own
        for name in others:
            module, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(module), attribute, model.get_parameter(first))
    for module in model.modules():
        if isinstance(module, SinusoidalPositions) and module.table.is_meta:
            module.table = type(module)(module.d_model, module.table.size(0), halves=module.halves).table
    left = next((name for name, t in itertools.chain(model.named_parameters(), model.named_buffers()) if t.is_meta), None)
    if left is not None:
        raise RuntimeError(f"{left} was built on the meta device and neither loaded nor derived")  # a module mtkit added
    return model


def _check_fit(expected: dict[str, Tensor], weights: dict[str, Tensor], mismatch: str) -> None:
    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected]
    if missing or unexpected:
        lacks = f"lacks {missing[0]}" if missing else f"has {unexpected[0]}, which the config's model has not"
        raise MtkitError(f"{mismatch}: it {lacks} ({len(missing)} missing, {len(unexpected)} unexpected)")
    for name, tensor in expected.items():
        if weights[name].shape != tensor.shape:
            raise MtkitError(
                f"{mismatch}: {name} has shape {list(weights[name].shape)} in the weights, {list(tensor.shape)} by the config"
            )


def _parameter_names(model: torch.nn.Module) -> dict[int, list[str]]:
    """Every parameter's names (several where it is tied), by the parameter."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return names


def _owned(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    """`tensor` as the model holds it: in `dtype`, and copied where it is a view of a larger storage (a mapped file,
    which the model would otherwise keep whole and a checkpoint would save whole)."""
    tensor = tensor.to(dtype)
    if tensor.untyped_storage().nbytes() != tensor.nbytes or not tensor.is_contiguous():
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def average_checkpoints(run_dir: Path, last: int) -> tuple[dict[str, Any], list[Path]]:
    """The element-wise mean of the weights in the run's `last` newest step_*.pt checkpoints.

    Config, tokenizers and progress come from the newest one, so the result loads like any checkpoint.
    """
    if last < 1:
        raise MtkitError(f"--last {last}: give the number of checkpoints to average (at least 1)")
    paths = RunFiles(Path(run_dir)).steps()[-last:]
    if len(paths) < last:
        raise MtkitError(
            f"{run_dir}: {len(paths)} step_*.pt checkpoints found but --last {last} asked for; "
            f"train with --set train.keep={last} (or more) to keep them"
        )
    payloads = [read_checkpoint(path) for path in paths]
    if LORA_PARENT in payloads[-1]:  # the mean of A and of B is not the mean of the models' B A
        raise MtkitError(f"{run_dir}: a LoRA run's checkpoints hold adapters, whose average is no average of its models")
    averaged = dict(payloads[-1])
    averaged["model"] = {
        name: torch.stack([p["model"][name].float() for p in payloads]).mean(dim=0).to(value.dtype)
        if value.is_floating_point()
        else value
        for name, value in payloads[-1]["model"].items()
    }
    averaged["averaged_from"] = [path.name for path in paths]
    for key in ("optimizer", "scheduler", "rng"):
        averaged.pop(key, None)
    return averaged, paths
