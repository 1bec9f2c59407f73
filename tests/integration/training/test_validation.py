"""The scores training logs at validation are those `mtkit evaluate` gives for the same checkpoint."""

from __future__ import annotations

import json

import torch

from mtkit.data.store import load_prepared
from mtkit.decoding.engine import PyTorchEngine
from mtkit.decoding.translator import Translator
from mtkit.evaluation.metrics import score_corpus
from mtkit.models.checkpoint import load_model
from mtkit.training.validation import valid_loss, validate

CPU = torch.device("cpu")


def test_validation_gives_the_logged_scores_and_the_bleu_of_evaluate(reverse_run):
    model, config, tokenizers, _ = load_model(reverse_run.run_path / "last.pt")
    valid = load_prepared(reverse_run.data_path, "valid")
    result = validate(model, valid=valid, tokenizers=tokenizers, config=config, device=CPU, amp_dtype=None)

    records = [json.loads(line) for line in (reverse_run.run_path / "log.jsonl").read_text().splitlines()]
    logged = [r for r in records if "valid_bleu" in r][-1]
    assert logged["step"] == reverse_run.train.max_steps
    assert result.record() == {key: logged[key] for key in ("valid_loss", "valid_ppl", "valid_bleu")}
    assert result.bleu > 90

    translator = Translator(PyTorchEngine(model.eval(), CPU), tokenizers, decode=config.decode, normalize=config.data.normalize)
    hypotheses = translator.translate(list(valid["src"]), beam=config.train.valid_beam)
    assert result.bleu == score_corpus(hypotheses, [list(valid["tgt"])]).scores[0].score  # BLEU as `mtkit evaluate` reports it
    assert result.loss == valid_loss(model, valid, device=CPU, amp_dtype=None)
