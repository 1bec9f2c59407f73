"""Validation during training: the loss and BLEU of a model on the prepared valid split.

BLEU is scored as `mtkit evaluate` scores it (`mtkit.evaluation.metrics.bleu`), on the detokenised output of
the same `Translator` pipeline that `mtkit translate` uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import datasets
import torch

from mtkit.config import Config
from mtkit.data.tokenizer import TokenizerPair
from mtkit.decoding.engine import PyTorchEngine
from mtkit.decoding.translator import Translator
from mtkit.evaluation.metrics import bleu
from mtkit.models.base import EncoderDecoder
from mtkit.runtime import autocast
from mtkit.training.batches import ParallelIds
from mtkit.training.loss import sequence_loss

LOSS_BATCH_SIZE = 64  # sentence pairs per batch of the valid loss


@dataclass(frozen=True)
class Validation:
    """One validation's scores."""

    loss: float  # per target token, without label smoothing
    bleu: float  # corpus BLEU of the decoded valid split

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50))

    def record(self) -> dict[str, float]:
        """The scores as log.jsonl reports them (rounded)."""
        return {"valid_loss": round(self.loss, 4), "valid_ppl": round(self.perplexity, 2), "valid_bleu": round(self.bleu, 2)}


def validate(
    model: EncoderDecoder,
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
        translator = Translator(PyTorchEngine(model, device), tokenizers, decode, config.data.normalize)
        hypotheses = translator.translate(list(valid["src"]), beam=config.train.valid_beam)
        return Validation(loss, bleu(hypotheses, list(valid["tgt"])))
    finally:
        model.train(was_training)


@torch.inference_mode()
def valid_loss(model: EncoderDecoder, valid: datasets.Dataset, device: torch.device, amp_dtype: torch.dtype | None) -> float:
    """Teacher-forced loss per target token of `valid`, without label smoothing, in the model's current mode."""
    ids = ParallelIds(valid)
    total, tokens = 0.0, 0
    for start in range(0, len(ids), LOSS_BATCH_SIZE):
        batch = ids.collate(list(range(start, min(start + LOSS_BATCH_SIZE, len(ids))))).to(device)
        with autocast(device, amp_dtype):
            logits = model(batch.src, batch.src_mask, batch.tgt_in)
        total += sequence_loss(logits, batch.tgt_out, 0.0).item()
        tokens += batch.num_tokens
    return total / max(tokens, 1)
