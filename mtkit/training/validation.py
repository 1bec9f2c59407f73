"""Validation during training: the loss and BLEU of a model on the prepared valid split, and with
`train.validate_metric` comet or qe a COMET model's score (the metric that then chooses best.pt).

BLEU is scored as `mtkit evaluate` scores it (`mtkit.evaluation.metrics.bleu`), on the detokenised output of
the same `Translator` pipeline that `mtkit translate` uses; COMET with `mtkit evaluate`'s scorer
(`mtkit.evaluation.comet`), loaded once per training.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from mtkit.config import Config, TrainConfig, direction, split_languages
from mtkit.data.store import PreparedSplit
from mtkit.data.tokenizer import TokenizerPair
from mtkit.decoding.engine import PyTorchEngine
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.comet.scorer import CometScorer
from mtkit.evaluation.metrics import METRICS, bleu, chrf
from mtkit.models.base import EncoderDecoder
from mtkit.runtime import autocast
from mtkit.training.batches import ParallelIds
from mtkit.training.loss import sequence_loss
from mtkit.training.progress import Progress

LOSS_BATCH_SIZE = 64  # sentence pairs per batch of the valid loss


@dataclass(frozen=True, kw_only=True)
class Quality:
    """A COMET or COMET-QE score of one validation (`train.validate_metric`), and what it cost."""

    metric: str  # comet or qe
    score: float  # the mean sentence score of the lines scored; with several valid directions, the mean of theirs
    seconds: float  # the scoring alone (the lines were decoded for BLEU anyway)
    directions: dict[str, float] = field(default_factory=dict)  # with several valid directions: each one's score

    def record(self) -> dict[str, float]:
        """As log.jsonl reports it: valid_comet, valid_comet_s (its seconds) and valid_comet_de-en per direction."""
        record = {f"valid_{self.metric}": round(self.score, 4), f"valid_{self.metric}_s": round(self.seconds, 1)}
        return record | {f"valid_{self.metric}_{way}": round(score, 4) for way, score in self.directions.items()}

    def describe(self) -> str:
        """'COMET 0.7312 (T s)', as the training log prints it."""
        return f"{METRICS[self.metric].name} {self.score:.4f} ({self.seconds:.1f} s)"


@dataclass(frozen=True, kw_only=True)
class Validation:
    """One validation's scores."""

    loss: float  # per target token, without label smoothing
    bleu: float  # corpus BLEU of the decoded valid split; with several directions, the mean of theirs
    # with several valid directions: each one's {"bleu", "chrf"}, by direction ("de-en")
    directions: dict[str, dict[str, float]] = field(default_factory=dict)
    quality: Quality | None = None  # with train.validate_metric comet or qe: its score, which chooses best.pt

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50))

    def record(self) -> dict[str, float]:
        """The scores as log.jsonl reports them (rounded): valid_bleu_de-en and valid_chrf_de-en per direction,
        and the metric's valid_comet (or valid_qe) with its seconds."""
        record = {"valid_loss": round(self.loss, 4), "valid_ppl": round(self.perplexity, 2), "valid_bleu": round(self.bleu, 2)}
        for way, scores in self.directions.items():
            record |= {f"valid_{metric}_{way}": round(score, 2) for metric, score in scores.items()}
        return record | (self.quality.record() if self.quality is not None else {})

    def describe(self) -> str:
        """'de-en 31.2, fr-en 35.0' (empty with one direction), as the training log prints it."""
        return ", ".join(f"{way} {scores['bleu']:.2f}" for way, scores in self.directions.items())

    @property
    def quality_score(self) -> float | None:
        """The COMET or COMET-QE score, with train.validate_metric comet or qe."""
        return self.quality.score if self.quality is not None else None

    def weights_record(self) -> dict[str, float]:
        """What an end-of-training average.pt or ema.pt records of its own validation: valid_bleu (and valid_comet)."""
        quality = {f"valid_{self.quality.metric}": self.quality.score} if self.quality is not None else {}
        return {"valid_bleu": self.bleu, **quality}


def validation_line(progress: Progress, result: Validation) -> str:
    """The training log's line for a validation that `progress` has recorded: 'step 500: valid loss 3.100,
    BLEU 20.10, COMET 0.7312 (T s) (best COMET 0.7312 at step 500)'; with BLEU, '(best 20.10 at step 500)'."""
    per_direction = f" (mean of {result.describe()})" if result.directions else ""
    quality = f", {result.quality.describe()}" if result.quality is not None else ""
    best = f"{progress.best_bleu:.2f}" if progress.metric == "bleu" else f"{METRICS[progress.metric].name} {progress.best:.4f}"
    return (
        f"step {progress.step}: valid loss {result.loss:.3f}, BLEU {result.bleu:.2f}{per_direction}{quality} "
        f"(best {best} at step {progress.best_step})"
    )


def best_text(progress: Progress) -> str:
    """The best validation so far by the run's metric: 'BLEU 20.10', or 'COMET 0.7400 (BLEU 20.10)'."""
    if progress.metric == "bleu":
        return f"BLEU {progress.best_bleu:.2f}"
    return f"{METRICS[progress.metric].name} {progress.best:.4f} (BLEU {progress.best_bleu:.2f})"


def final_weights_report(stem: str, result: Validation, *, progress: Progress) -> tuple[dict[str, float], str]:
    """An end-of-training average.pt or ema.pt (`stem`) beside best.pt: the log.jsonl fields
    (average_valid_bleu, best_valid_bleu; with COMET also average_valid_comet, best_valid_comet) and the
    line's scores ('valid BLEU 20.10, best.pt 20.40'; with COMET 'valid BLEU 20.10, COMET 0.7312, best.pt COMET 0.7400')."""
    fields = {f"{stem}_{key}": score for key, score in result.weights_record().items()}
    if result.quality is None or progress.metric == "bleu":
        return fields | {"best_valid_bleu": progress.best_bleu}, f"valid BLEU {result.bleu:.2f}, best.pt {progress.best_bleu:.2f}"
    name = METRICS[progress.metric].name
    said = f"valid BLEU {result.bleu:.2f}, {name} {result.quality.score:.4f}, best.pt {name} {progress.best:.4f}"
    return fields | {f"best_valid_{progress.metric}": progress.best}, said


class ValidationMetric:
    """`train.validate_metric` comet or qe: its COMET model, loaded once per training, and how many lines of each
    validation set it scores (`train.validate_lines`)."""

    def __init__(self, name: str, scorer: CometScorer, *, lines: int) -> None:
        self.name, self.scorer, self.lines = name, scorer, lines

    @classmethod
    def load(cls, config: TrainConfig, device: torch.device) -> ValidationMetric | None:
        """None with BLEU; else the COMET model on `device`, checked to be of the metric's kind (with or without
        references). Called before the run directory is touched, so a wrong model is one line and nothing written."""
        if config.validate_metric == "bleu":
            return None
        model, encoder = config.comet_model or "", Path(config.comet_encoder).expanduser() if config.comet_encoder else None
        try:  # the encoder is built (randomly initialised) before its weights are read: the run's seeded RNG is kept
            with torch.random.fork_rng(devices=[]):
                scorer = CometScorer.load(CometOptions(model=model, encoder=encoder, device=str(device)))
        except MtkitError as err:  # the scorer names evaluate's options; here they are recipe keys
            said = str(err).replace("--comet-model", "train.comet_model").replace("--comet-encoder", "train.comet_encoder")
            raise MtkitError(said) from None
        with_references = config.validate_metric == "comet"
        if scorer.needs_references != with_references:  # as `mtkit evaluate --metric` refuses it
            kind = "a reference-free (QE) model" if with_references else "which scores against references"
            advice = "use qe" if with_references else "use comet, or a QE model such as Unbabel/wmt22-cometkiwi-da"
            raise MtkitError(f"train.validate_metric {config.validate_metric} with train.comet_model {model}, {kind}: {advice}")
        return cls(config.validate_metric, scorer, lines=config.validate_lines)

    def measure(self, sets: list[DecodedSet]) -> Quality:
        """The mean score of the first `lines` of each decoded set (all with 0), and the seconds it took."""
        start = time.perf_counter()
        scores = {decoded.direction: self._mean(decoded) for decoded in sets}
        seconds = time.perf_counter() - start
        return Quality(
            metric=self.name,
            score=sum(scores.values()) / len(scores),
            seconds=seconds,
            directions=scores if len(scores) > 1 else {},
        )

    def _mean(self, decoded: DecodedSet) -> float:
        count = self.lines or len(decoded.sources)
        references = decoded.references[:count] if self.scorer.needs_references else None
        scores = self.scorer.score(decoded.sources[:count], decoded.hypotheses[:count], references=references)
        return sum(scores) / max(len(scores), 1)


@dataclass(frozen=True, kw_only=True)
class DecodedSet:
    """One validation set (one direction) decoded: its sources, the model's translations and the references."""

    direction: str  # "de-en"
    sources: list[str]
    hypotheses: list[str]
    references: list[str]


def validate(
    model: EncoderDecoder,
    *,
    valid: PreparedSplit,
    tokenizers: TokenizerPair,
    config: Config,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    metric: ValidationMetric | None = None,
) -> Validation:
    """Loss and BLEU of `model` on `valid` (a split from `load_prepared`), decoded at `train.valid_beam`, and
    with `metric` its COMET or COMET-QE score.

    The model is switched to eval mode for the validation and back to the mode it was in after
    (train mode during training); autocast to `amp_dtype` as in training.
    """
    was_training = model.training
    model.eval()
    try:
        loss = valid_loss(model, valid, device=device, amp_dtype=amp_dtype)
        decode = replace(config.decode, beam=config.train.valid_beam)
        translator = Translator(
            PyTorchEngine(model, device), tokenizers, decode=decode, normalize=config.data.normalize, config=config
        )
        sets = _decoded_sets(translator, config, valid)
        quality = metric.measure(sets) if metric is not None else None
        if len(sets) == 1:
            return Validation(loss=loss, bleu=bleu(sets[0].hypotheses, sets[0].references), quality=quality)
        directions = {
            decoded.direction: {
                "bleu": bleu(decoded.hypotheses, decoded.references),
                "chrf": chrf(decoded.hypotheses, decoded.references),
            }
            for decoded in sets
        }
        mean = sum(scores["bleu"] for scores in directions.values()) / len(directions)
        return Validation(loss=loss, bleu=mean, directions=directions, quality=quality)
    finally:
        model.train(was_training)


def check_valid_sets(config: Config, valid: PreparedSplit) -> None:
    """The prepared valid split holds the recipe's validation sets (one per direction), else one error."""
    sets = len(config.data.valid)
    prepared = len(set(valid["corpus"])) if "corpus" in valid.column_names else 1
    if prepared != sets:
        raise MtkitError(
            f"{config.data_path}: the recipe has {sets} validation sets but the data was prepared with {prepared}; "
            "run `mtkit prepare RECIPE` again"
        )


def _decoded_sets(translator: Translator, config: Config, valid: PreparedSplit) -> list[DecodedSet]:
    """Each validation set of the recipe (`data.valid`, one per direction) decoded at `train.valid_beam`."""
    sources, references = list(valid["src"]), list(valid["tgt"])
    corpus = list(valid["corpus"]) if len(config.data.valid) > 1 else [0] * len(sources)
    sets = []
    for index, split in enumerate(config.data.valid):
        rows = [row for row, which in enumerate(corpus) if which == index]
        src_lang, tgt_lang = split_languages(config, split)
        coded = config.data.lang_tag == "code"  # a model with language codes reads the source's and writes the target's
        picked = [sources[row] for row in rows]
        hypotheses = translator.translate(
            picked, config.train.valid_beam, tgt_lang=tgt_lang if translator.tagged or coded else None,
            src_lang=src_lang if coded else None,
        )  # fmt: skip
        sets.append(
            DecodedSet(
                direction=direction(config, split),
                sources=picked,
                hypotheses=hypotheses,
                references=[references[row] for row in rows],
            )
        )
    return sets


@torch.inference_mode()
def valid_loss(model: EncoderDecoder, valid: PreparedSplit, *, device: torch.device, amp_dtype: torch.dtype | None) -> float:
    """Teacher-forced loss per target token of `valid`, without label smoothing, in the model's current mode."""
    ids = ParallelIds(valid)
    total, tokens = 0.0, 0
    for start in range(0, len(ids), LOSS_BATCH_SIZE):
        batch = ids.collate(list(range(start, min(start + LOSS_BATCH_SIZE, len(ids))))).to(device)
        with autocast(device, amp_dtype):
            logits = model(batch.src, batch.src_mask, batch.tgt_in, src_padded=batch.src_padded)
        total += sequence_loss(logits, batch.tgt_out, label_smoothing=0.0).item()
        tokens += batch.num_tokens
    return total / max(tokens, 1)
