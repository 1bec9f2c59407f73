"""Validation during training: the loss and BLEU of a model on the prepared valid split.

BLEU is scored as `mtkit evaluate` scores it (`mtkit.evaluation.metrics.bleu`), on the detokenised output of
the same `Translator` pipeline that `mtkit translate` uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import datasets
import torch

from mtkit.config import Config, direction, split_languages
from mtkit.data.tokenizer import TokenizerPair
from mtkit.decoding.engine import PyTorchEngine
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.evaluation.metrics import bleu, chrf
from mtkit.models.base import EncoderDecoder
from mtkit.runtime import autocast
from mtkit.training.batches import ParallelIds
from mtkit.training.loss import sequence_loss

LOSS_BATCH_SIZE = 64  # sentence pairs per batch of the valid loss


@dataclass(frozen=True)
class Validation:
    """One validation's scores."""

    loss: float  # per target token, without label smoothing
    bleu: float  # corpus BLEU of the decoded valid split; with several directions, the mean of theirs
    # with several valid directions: each one's {"bleu", "chrf"}, by direction ("de-en")
    directions: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50))

    def record(self) -> dict[str, float]:
        """The scores as log.jsonl reports them (rounded): valid_bleu_de-en and valid_chrf_de-en per direction."""
        record = {"valid_loss": round(self.loss, 4), "valid_ppl": round(self.perplexity, 2), "valid_bleu": round(self.bleu, 2)}
        for way, scores in self.directions.items():
            record |= {f"valid_{metric}_{way}": round(score, 2) for metric, score in scores.items()}
        return record

    def describe(self) -> str:
        """'de-en 31.2, fr-en 35.0' (empty with one direction), as the training log prints it."""
        return ", ".join(f"{way} {scores['bleu']:.2f}" for way, scores in self.directions.items())


def validate(
    model: EncoderDecoder,
    *,
    valid: datasets.Dataset,
    tokenizers: TokenizerPair,
    config: Config,
    device: torch.device,
    amp_dtype: torch.dtype | None,
) -> Validation:
    """Loss and BLEU of `model` on `valid` (a split from `load_prepared`), decoded at `train.valid_beam`.

    The model is switched to eval mode for the validation and back to the mode it was in after
    (train mode during training); autocast to `amp_dtype` as in training.
    """
    was_training = model.training
    model.eval()
    try:
        loss = valid_loss(model, valid, device, amp_dtype)
        decode = replace(config.decode, beam=config.train.valid_beam)
        translator = Translator(PyTorchEngine(model, device), tokenizers, decode, config.data.normalize, config)
        sources, references = list(valid["src"]), list(valid["tgt"])
        if len(config.data.valid) == 1:
            tgt_lang = split_languages(config, config.data.valid[0])[1] if translator.tagged else None
            return Validation(loss, bleu(translator.translate(sources, config.train.valid_beam, tgt_lang=tgt_lang), references))
        return Validation(loss, *_per_direction(translator, config, valid["corpus"], sources, references))
    finally:
        model.train(was_training)


def check_valid_sets(config: Config, valid: datasets.Dataset) -> None:
    """The prepared valid split holds the recipe's validation sets (one per direction), else one error."""
    sets = len(config.data.valid)
    prepared = len(set(valid["corpus"])) if "corpus" in valid.column_names else 1
    if prepared != sets:
        raise MtkitError(
            f"{config.data_path}: the recipe has {sets} validation sets but the data was prepared with {prepared}; "
            "run `mtkit prepare RECIPE` again"
        )


def _per_direction(
    translator: Translator, config: Config, corpus: list[int], sources: list[str], references: list[str]
) -> tuple[float, dict[str, dict[str, float]]]:
    """The mean BLEU of the valid directions (each a set of `data.valid`), and each one's BLEU and chrF."""
    scores = {}
    for index, split in enumerate(config.data.valid):
        rows = [row for row, which in enumerate(corpus) if which == index]
        tgt_lang = split_languages(config, split)[1] if translator.tagged else None
        hypotheses = translator.translate([sources[row] for row in rows], config.train.valid_beam, tgt_lang=tgt_lang)
        wanted = [references[row] for row in rows]
        scores[direction(config, split)] = {"bleu": bleu(hypotheses, wanted), "chrf": chrf(hypotheses, wanted)}
    return sum(score["bleu"] for score in scores.values()) / len(scores), scores


@torch.inference_mode()
def valid_loss(model: EncoderDecoder, valid: datasets.Dataset, device: torch.device, amp_dtype: torch.dtype | None) -> float:
    """Teacher-forced loss per target token of `valid`, without label smoothing, in the model's current mode."""
    ids = ParallelIds(valid)
    total, tokens = 0.0, 0
    for start in range(0, len(ids), LOSS_BATCH_SIZE):
        batch = ids.collate(list(range(start, min(start + LOSS_BATCH_SIZE, len(ids))))).to(device)
        with autocast(device, amp_dtype):
            logits = model(batch.src, batch.src_mask, batch.tgt_in, src_padded=batch.src_padded)
        total += sequence_loss(logits, batch.tgt_out, 0.0).item()
        tokens += batch.num_tokens
    return total / max(tokens, 1)
