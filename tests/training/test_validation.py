"""Validation: eval mode only while validating, and the scores training logs are those `mtkit evaluate` gives."""

from __future__ import annotations

import dataclasses
import json
import math
from functools import partial

import pytest
import torch

from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import load_tokenizers
from mtkit.decoding.engine import PyTorchEngine
from mtkit.decoding.translator import Translator
from mtkit.evaluation.metrics import score_corpus
from mtkit.models import build_model
from mtkit.models.checkpoint import load_model
from mtkit.training.validation import Validation, valid_loss, validate

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def untrained(reverse_task):
    """The prepared reverse task, its tokenizers, valid split and an untrained model with dropout."""
    config = dataclasses.replace(reverse_task, model=dataclasses.replace(reverse_task.model, dropout=0.3))
    tokenizers = load_tokenizers(config.data_path, config.tokenizer.joint)
    torch.manual_seed(0)
    model = build_model(config.model, tokenizers.src.vocab_size, tokenizers.tgt.vocab_size, tokenizers.joint)
    return config, tokenizers, load_prepared(config.data_path, "valid"), model


def test_validation_runs_in_eval_mode_and_puts_the_model_back_in_train_mode(untrained):
    config, tokenizers, valid, model = untrained
    modes: list[bool] = []
    hooks = [module.register_forward_pre_hook(lambda module, args: modes.append(module.training)) for module in model.modules()]
    try:
        model.train()
        run = partial(validate, valid=valid, tokenizers=tokenizers, config=config, device=CPU, amp_dtype=None)
        first = run(model)
        assert modes and not any(modes)  # dropout was off for the loss and the decoding
        assert all(module.training for module in model.modules())
        model.eval()
        assert run(model) == first  # deterministic, whatever the mode before
        assert not any(module.training for module in model.modules())  # an eval model stays in eval mode
    finally:
        for hook in hooks:
            hook.remove()
    model.train()


def test_perplexity_and_record():
    result = Validation(loss=1.23456, bleu=12.3456)
    assert result.perplexity == pytest.approx(math.exp(1.23456))
    assert result.record() == {"valid_loss": 1.2346, "valid_ppl": 3.44, "valid_bleu": 12.35}
    assert Validation(loss=1000.0, bleu=0.0).perplexity == math.exp(50)  # capped, not inf


def test_validation_gives_the_logged_scores_and_the_bleu_of_evaluate(reverse_run):
    model, config, tokenizers, _ = load_model(reverse_run.run_path / "last.pt")
    valid = load_prepared(reverse_run.data_path, "valid")
    result = validate(model, valid=valid, tokenizers=tokenizers, config=config, device=CPU, amp_dtype=None)

    records = [json.loads(line) for line in (reverse_run.run_path / "log.jsonl").read_text().splitlines()]
    logged = [r for r in records if "valid_bleu" in r][-1]
    assert logged["step"] == reverse_run.train.max_steps
    assert result.record() == {key: logged[key] for key in ("valid_loss", "valid_ppl", "valid_bleu")}
    assert result.bleu > 90

    translator = Translator(PyTorchEngine(model.eval(), CPU), tokenizers, config.decode, config.data.normalize)
    hypotheses = translator.translate(list(valid["src"]), beam=config.train.valid_beam)
    assert result.bleu == score_corpus(hypotheses, [list(valid["tgt"])]).scores[0].score  # BLEU as `mtkit evaluate` reports it
    assert result.loss == valid_loss(model, valid, CPU, None)
