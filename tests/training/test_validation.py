"""Validation: eval mode only while validating, perplexity and the record (against `mtkit evaluate`:
tests/integration/training/test_validation.py)."""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import pytest
import torch

from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import load_tokenizers
from mtkit.models import build_model
from mtkit.training.validation import Validation, validate

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def untrained(reverse_task):
    """The prepared reverse task, its tokenizers, valid split and an untrained model with dropout."""
    config = dataclasses.replace(reverse_task, model=dataclasses.replace(reverse_task.model, dropout=0.3))
    tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    torch.manual_seed(0)
    model = build_model(
        config.model, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=tokenizers.joint
    )
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
