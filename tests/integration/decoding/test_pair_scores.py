"""`mtkit score`: teacher-forced log-probabilities of given pairs, through the Python API and the CLI."""

from __future__ import annotations

import json
import random

import pytest
import torch
from helpers import cli_output, write_text_lines
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.data.tokenizer import BOS_ID, EOS_ID
from mtkit.decoding.translator import Translator


@torch.inference_mode()
def forward_log_prob(model_translator: Translator, source: str, target: str) -> float:
    """The sum of teacher-forced log-probabilities from the model's forward, one pair alone."""
    model = model_translator.engine.model
    src = torch.tensor([[*model_translator.tokenizers.src.encode(source), EOS_ID]])
    gold = model_translator.tokenizers.tgt.encode(target) + [EOS_ID]
    log_probs = model(src, src.bool(), torch.tensor([[BOS_ID, *gold[:-1]]])).log_softmax(-1)[0]  # (T, V)
    return float(sum(log_probs[t, token] for t, token in enumerate(gold)))


def test_scores_are_the_teacher_forced_log_probabilities_of_the_forward(model_translator, model_valid):
    sources, targets = model_valid[0][:12], model_valid[1][:12]
    targets[3] = ""  # only the EOS is scored
    scores = model_translator.score(sources, targets)
    for source, target, score in zip(sources, targets, scores, strict=True):
        assert score.log_prob == pytest.approx(forward_log_prob(model_translator, source, target), abs=1e-4)
        assert score.tokens == len(model_translator.tokenizers.tgt.encode(target)) + 1
        assert score.average == pytest.approx(score.log_prob / score.tokens)


def test_the_models_own_translations_score_higher_than_shuffled_references(model_translator, model_valid):
    sources = model_valid[0][:40]
    own = model_translator.translate(sources, beam=4)
    shuffled = model_valid[1][:40]
    random.Random(0).shuffle(shuffled)
    mean = [sum(s.average for s in model_translator.score(sources, targets)) / 40 for targets in (own, shuffled)]
    assert mean[0] > mean[1] + 1.0


def test_score_cli_prints_tab_separated_or_json_lines_in_input_order(model_run, model_translator, model_valid, tmp_path):
    src, tgt = write_text_lines(tmp_path / "src", model_valid[0][:9]), write_text_lines(tmp_path / "tgt", model_valid[1][:9])
    expected = model_translator.score(model_valid[0][:9], model_valid[1][:9])
    rows = [line.split("\t") for line in cli_output("score", "-m", model_run.run_path, "--src", src, "--tgt", tgt).splitlines()]
    assert [float(row[0]) for row in rows] == pytest.approx([s.log_prob for s in expected], abs=1e-3)
    assert [int(row[2]) for row in rows] == [s.tokens for s in expected]
    cli_output("score", "-m", model_run.run_path, "--src", src, "--tgt", tgt, "--json", "-o", tmp_path / "scores.jsonl")
    records = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in records] == [s.tokens for s in expected]
    assert records[0]["average"] == pytest.approx(expected[0].average, abs=1e-5)


def test_score_cli_refuses_files_of_different_lengths(model_run, model_valid, tmp_path):
    src, tgt = write_text_lines(tmp_path / "src", model_valid[0][:5]), write_text_lines(tmp_path / "tgt", model_valid[1][:4])
    result = CliRunner().invoke(app, ["score", "-m", str(model_run.run_path), "--src", str(src), "--tgt", str(tgt)])
    assert result.exit_code == 2
    assert f"{src} has 5 lines but {tgt} has 4" in result.output
