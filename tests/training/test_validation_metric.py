"""train.validate_metric comet|qe: the recipe keys checked at load, the COMET model checked to be of the metric's
kind in one line, and a validation that scores the first train.validate_lines with it (tiny checkpoints of
tests/fixtures/comet/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from helpers import reverse_task_config

from mtkit.config import TrainConfig
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import load_tokenizers
from mtkit.errors import MtkitError
from mtkit.models import build_model
from mtkit.training.validation import ValidationMetric, validate

COMET = Path(__file__).resolve().parents[1] / "fixtures" / "comet"
ENCODER = str(COMET / "tiny-xlmr")
CPU = torch.device("cpu")


def config_error(tmp_path: Path, **train: object) -> str:
    with pytest.raises(MtkitError) as caught:
        reverse_task_config(tmp_path, **train)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_comet_metric_needs_a_model_and_the_comet_keys_need_a_metric(tmp_path):
    for metric in ("comet", "qe"):
        message = config_error(tmp_path, validate_metric=metric)
        assert f"'train.validate_metric' is '{metric}'" in message and "train.comet_model" in message
    for key, value in (("comet_model", "Unbabel/wmt22-comet-da"), ("comet_encoder", ENCODER), ("validate_lines", 100)):
        message = config_error(tmp_path, **{key: value})
        assert f"'train.{key}'" in message and "train.validate_metric comet" in message
    assert "give a whole number" in config_error(tmp_path, validate_metric="qe", comet_model="m", validate_lines=-1)
    assert "bleu, comet" in config_error(tmp_path, validate_metric="chrf")
    config = reverse_task_config(tmp_path, validate_metric="qe", comet_model="m", comet_encoder=ENCODER, validate_lines=100)
    assert (config.train.validate_metric, config.train.validate_lines) == ("qe", 100)
    assert TrainConfig().validate_metric == "bleu"


def metric_load(metric: str, model: str, encoder: str | None = ENCODER, lines: int = 0) -> ValidationMetric | None:
    train = TrainConfig(validate_metric=metric, comet_model=model, comet_encoder=encoder, validate_lines=lines)
    return ValidationMetric.load(train, CPU)


def load_error(metric: str, model: str, encoder: str | None = ENCODER) -> str:
    with pytest.raises(MtkitError) as caught:
        metric_load(metric, model, encoder)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_model_must_be_of_the_metrics_kind():
    assert metric_load("bleu", str(COMET / "unified")) is None
    assert metric_load("comet", str(COMET / "regression")).name == "comet"
    assert metric_load("qe", str(COMET / "unified")).name == "qe"
    message = load_error("qe", str(COMET / "regression"))
    assert message.startswith("train.validate_metric qe with train.comet_model") and "scores against references" in message
    assert "a reference-free (QE) model: use qe" in load_error("comet", str(COMET / "referenceless"))


def test_a_missing_model_or_encoder_names_the_recipe_key(tmp_path):
    assert load_error("qe", str(tmp_path / "nothing")).startswith(f"train.comet_model {tmp_path / 'nothing'}: no such folder")
    message = load_error("qe", str(COMET / "unified"), encoder=str(tmp_path))
    assert message.startswith(f"train.comet_encoder {tmp_path}: no config.json") and "--comet" not in message


def test_validation_scores_the_first_lines_with_the_metric_beside_bleu(reverse_task):
    config = dataclasses.replace(reverse_task, train=dataclasses.replace(reverse_task.train, valid_beam=1))
    tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    valid = load_prepared(config.data_path, "valid")
    torch.manual_seed(0)
    model = build_model(
        config.model, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=tokenizers.joint
    )
    metric = metric_load("qe", str(COMET / "referenceless"), lines=3)
    seen, score = [], metric.scorer.score

    def scored(sources, translations, references=None, **options):
        seen.append((sources, translations, references))
        return score(sources, translations, references=references, **options)

    metric.scorer.score = scored
    run = dict(valid=valid, tokenizers=tokenizers, config=config, device=CPU, amp_dtype=None)
    result, plain = validate(model, **run, metric=metric), validate(model, **run)
    [(sources, translations, references)] = seen
    assert sources == list(valid["src"])[:3] and len(translations) == 3 and references is None
    assert result.quality.score == pytest.approx(sum(score(sources, translations)) / 3)
    assert result.quality.metric == "qe" and result.quality.seconds > 0 and result.quality_score == result.quality.score
    assert (result.loss, result.bleu) == (plain.loss, plain.bleu) and plain.quality is None  # BLEU as without it
    assert set(result.record()) == set(plain.record()) | {"valid_qe", "valid_qe_s"}
