"""mtkit evaluate --metric comet|qe on the tiny COMET checkpoints (tests/fixtures/comet/): the score with its
signature beside sacreBLEU's, sentence scores in --json, the paired tests, scores.json, and one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli_output, invoke, write_text_lines

from mtkit.evaluation.metrics import EvalResult, Score
from mtkit.evaluation.report import save_scores

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "comet"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))
TESTS = ("--bootstrap-samples", 100, "--randomisation-trials", 200)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("comet-files")
    worse = [" ".join(line.split()[:2]) for line in EXPECTED["translations"]]
    return {
        "src": write_text_lines(folder / "src.de", EXPECTED["sources"]),
        "ref": write_text_lines(folder / "ref.en", EXPECTED["references"]),
        "hyp": write_text_lines(folder / "hyp.en", EXPECTED["translations"]),
        "worse": write_text_lines(folder / "worse.en", worse),
    }


def comet_options(name: str, metric: str = "comet") -> tuple:
    return ("--metric", metric, "--comet-model", FIXTURES / name, "--comet-encoder", FIXTURES / "tiny-xlmr", "--device", "cpu")


def test_comet_beside_bleu_with_sentence_scores_and_paired_tests(files):
    arguments = ("evaluate", "--hyp", files["hyp"], "--hyp", files["worse"], "--ref", files["ref"], "--src", files["src"])
    report = json.loads(cli_output(*arguments, *comet_options("regression"), *TESTS, "--json"))
    first, second = report["systems"]
    expected = EXPECTED["models"]["regression"]["scores"]
    assert [round(x, 5) for x in first["sentence_scores"]["COMET"]] == [round(x, 5) for x in expected]
    assert first["scores"]["COMET"]["score"] == pytest.approx(sum(expected) / len(expected), abs=1e-5)
    assert first["scores"]["COMET"]["signature"].endswith("|precision:fp32") and "BLEU" in first["scores"]
    assert len(second["sentence_scores"]["COMET"]) == len(expected)
    baseline, other = report["comparison"]["scores"]["COMET"]
    assert baseline["p_bootstrap"] is None and 0 < other["p_bootstrap"] <= 1 and 0 < other["p_randomisation"] <= 1
    assert other["score"] == pytest.approx(second["scores"]["COMET"]["score"])
    text = cli_output(*arguments, *comet_options("regression"), *TESTS)
    line = next(line for line in text.splitlines() if line.startswith("COMET "))
    assert line.split()[1:3] == [f"{first['scores']['COMET']['score']:.4f}", "signature:"] and "model:" in line
    assert any(line.startswith("COMET") and "p (bootstrap)" in line for line in text.splitlines())  # the paired tests


def test_qe_needs_no_reference_model_and_scores_from_the_source(files):
    arguments = ("evaluate", "--hyp", files["hyp"], "--ref", files["ref"], "--src", files["src"], "--json")
    report = json.loads(cli_output(*arguments, *comet_options("unified", "qe")))
    expected = EXPECTED["models"]["unified"]["system_score"]
    assert report["scores"]["COMET-QE"]["score"] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("name", ["unified", "referenceless"])
def test_qe_scores_from_the_sources_alone_without_references_as_unbabel_comet_does(files, name):
    arguments = ("evaluate", "--hyp", files["hyp"], "--src", files["src"], *comet_options(name, "qe"), "--json")
    report = json.loads(cli_output(*arguments))
    assert list(report["scores"]) == ["COMET-QE"]  # no reference: no BLEU, chrF or TER
    assert report["scores"]["COMET-QE"]["score"] == pytest.approx(EXPECTED["models"][name]["system_score"], abs=1e-5)
    expected = EXPECTED["models"][name]["scores"]
    assert max(abs(a - b) for a, b in zip(report["sentence_scores"]["COMET-QE"], expected, strict=True)) < 1e-5
    assert report["num_sentences"] == len(expected) and set(report["flags"]) >= {"loop", "too_long"}


def test_systems_without_references_are_compared_by_qe_and_flagged(files, tmp_path):
    flags = tmp_path / "flags.tsv"
    arguments = ("evaluate", "--hyp", files["hyp"], "--hyp", files["worse"], "--src", files["src"], "--flags", flags)
    text = cli_output(*arguments, *comet_options("unified", "qe"), *TESTS)
    assert "paired tests against" in text and "(COMET's over its sentence scores;" in text and "BLEU" not in text
    assert flags.read_text(encoding="utf-8").startswith("system\tline\tflags\tsource\thypothesis\treference\n")


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        ((), ["BLEU, chrF and TER score against references: give --ref FILE", "--metric qe"]),
        (comet_options("regression"), ["--metric comet scores against references: give --ref FILE"]),
        ((*comet_options("unified", "qe"), "--off-target"), ["--off-target is reported beside each direction's BLEU"]),
    ],
    ids=["sacrebleu", "comet", "off-target"],
)
def test_metrics_that_need_references_say_so_without_them(files, options, needles):
    assert_one_line_error(invoke("evaluate", "--hyp", files["hyp"], "--src", files["src"], *options), *needles)


@pytest.mark.parametrize("references", [True, False], ids=["with-references", "without"])
def test_an_empty_input_is_one_line(files, tmp_path, references):
    empty = write_text_lines(tmp_path / "empty.txt", [])
    refs = ("--ref", empty) if references else ()
    result = invoke("evaluate", "--hyp", empty, *refs, "--src", files["src"], *comet_options("referenceless", "qe"))
    assert_one_line_error(result, f"--hyp {empty}: no sentences to score")
    result = invoke("evaluate", "--hyp", empty, *refs, "--src", empty, *comet_options("referenceless", "qe"))
    assert_one_line_error(result, f"--src {empty}: no sentences to score")


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        (("--metric", "comet"), ["--metric comet needs --comet-model M"]),
        (comet_options("referenceless"), ["a reference-free (QE) model: use --metric qe"]),
        (comet_options("regression", "qe"), ["which scores against references: use --metric comet"]),
        (("--comet-model", FIXTURES / "unified"), ["scores with --metric comet (or qe"]),
        (("--metric", "comet", "--comet-model", FIXTURES / "missing"), ["missing: no such folder"]),
        (("--metric", "qe", "--comet-model", FIXTURES / "tiny-xlmr"), ["not a COMET folder"]),
    ],
)
def test_bad_comet_options_are_one_line(files, options, needles):
    result = invoke("evaluate", "--hyp", files["hyp"], "--ref", files["ref"], "--src", files["src"], *options)
    assert_one_line_error(result, *needles)


def test_comet_without_the_sources_is_one_line(files):
    result = invoke("evaluate", "--hyp", files["hyp"], "--ref", files["ref"], *comet_options("regression"))
    assert_one_line_error(result, "--metric comet reads the sources too: give --src FILE")


def test_scores_json_keeps_four_decimals_of_comet(tmp_path):
    result = EvalResult(
        [
            Score(name="BLEU", score=31.4159, signature="nrefs:1"),
            Score(name="COMET", score=0.843219, signature="model:m", digits=4),
        ],
        3,
    )
    saved = json.loads(save_scores(tmp_path, "test", result=result).read_text(encoding="utf-8"))
    assert saved["test"]["BLEU"] == 31.42 and saved["test"]["COMET"] == 0.8432
