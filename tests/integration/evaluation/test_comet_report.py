"""`mtkit evaluate -m RUN --split valid --metric qe`: a model translates, a tiny COMET-QE checkpoint scores, and
the score goes into the run's scores.json; a bad COMET model is refused before anything is translated."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers import assert_one_line_error, cli_output, invoke, write_text_lines

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "comet"
QE = ("--metric", "qe", "--comet-model", FIXTURES / "unified", "--comet-encoder", FIXTURES / "tiny-xlmr")


def test_a_model_split_is_scored_by_comet_qe_and_recorded(reverse_run, tmp_path):
    run = shutil.copytree(reverse_run.run_path, tmp_path / "run")
    report = json.loads(cli_output("evaluate", "-m", run, "--split", "valid", "--beam", "1", *QE, "--device", "cpu", "--json"))
    sentences = report["sentence_scores"]["COMET-QE"]
    assert len(sentences) == report["num_sentences"] and report["scores"]["COMET-QE"]["score"] == sum(sentences) / len(sentences)
    recorded = json.loads((run / "scores.json").read_text(encoding="utf-8"))["valid"]
    assert recorded["COMET-QE"] == round(report["scores"]["COMET-QE"]["score"], 4)
    assert recorded["signatures"]["COMET-QE"].endswith("precision:fp32")


def test_a_source_file_is_translated_and_scored_by_comet_qe_without_references(reverse_run, tmp_path):
    source = write_text_lines(tmp_path / "src.txt", ["a b c", "d e f g", "h i j k l"])
    arguments = ("evaluate", "-m", reverse_run.run_path, "--src", source, "--beam", "1", "--device", "cpu")
    report = json.loads(cli_output(*arguments, *QE, "--json"))
    assert list(report["scores"]) == ["COMET-QE"] and len(report["sentence_scores"]["COMET-QE"]) == 3
    assert_one_line_error(invoke(*arguments), "BLEU, chrF and TER score against references: give --ref FILE")


def test_a_bad_comet_model_is_refused_before_translating(reverse_run, tmp_path):
    output = tmp_path / "hyp.txt"
    result = invoke("evaluate", "-m", reverse_run.run_path, "--split", "valid", "-o", output, "--metric", "comet",
                    "--comet-model", tmp_path / "nowhere")  # fmt: skip
    assert_one_line_error(result, "nowhere: no such folder")
    assert not output.exists()
