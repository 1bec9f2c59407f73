"""Tests for mtkit.evaluation.metrics: golden score tables, signatures, error messages, file reading."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import sacrebleu

from mtkit.errors import MtkitError
from mtkit.evaluation.metrics import LOWERCASED_BLEU, METRICS, EvalResult, score_corpus
from mtkit.textio import read_lines

VERSION = sacrebleu.__version__

# sacrebleu README ("Using the object-oriented API"): BLEU = 48.53, chrF2 = 59.73.
README_HYPS = [
    "The dog bit the man.",
    "It wasn't surprising.",
    "The man had just bitten him.",
]
README_REFS = [
    ["The dog bit the man.", "It was not unexpected.", "The man bit him first."],
    [
        "The dog had bit the man.",
        "No one was surprised.",
        "The man had bitten the dog.",
    ],
]

# Hand-computed BLEU with a brevity penalty:
# hyp "the cat sat on the mat" (6 tokens) vs ref "the cat sat on the red mat" (7 tokens)
#   1-grams: the cat sat on the mat          -> 6/6 match (the ref has "the" twice)
#   2-grams: the cat, cat sat, sat on, on the | the mat (ref has "the red", "red mat") -> 4/5
#   3-grams: the cat sat, cat sat on, sat on the | on the mat -> 3/4
#   4-grams: the cat sat on, cat sat on the | sat on the mat -> 2/3
#   brevity penalty: hyp 6 < ref 7 -> exp(1 - 7/6); BLEU = 67.32
CAT_BLEU = 100 * math.exp(1 - 7 / 6) * (6 / 6 * 4 / 5 * 3 / 4 * 2 / 3) ** (1 / 4)

# Hand-computed cased BLEU, hyp "The cat sat on the mat ." vs ref "the cat sat on the mat .":
# only "The" differs, so 1..4-gram precisions are 6/7, 5/6, 4/5, 3/4;
# the lengths are equal (BP 1).
CASED_BLEU = 100 * (6 / 7 * 5 / 6 * 4 / 5 * 3 / 4) ** (1 / 4)  # 80.91

# Hand-computed chrF2, hyp "the cat" vs ref "the cats". Whitespace is dropped, so the
# character strings are "thecat" (6) and "thecats" (7), and every hyp n-gram is in the ref:
# precision is 1 for n = 1..6; recall is (7-n)/(8-n) = 6/7, 5/6, 4/5, 3/4, 2/3, 1/2.
# F_beta with beta = 2: (1 + 4) * P * R / (4 * P + R) with P, R averaged over the six orders.
CHRF_RECALL = (6 / 7 + 5 / 6 + 4 / 5 + 3 / 4 + 2 / 3 + 1 / 2) / 6
CATS_CHRF = 100 * 5 * CHRF_RECALL / (4 + CHRF_RECALL)  # 77.57

SAME = ["the cat sat on the mat", "a dog barked"]
CAT_HYP, CAT_REF = ["the cat sat on the mat"], [["the cat sat on the red mat"]]
CASE_HYP, CASE_REF = ["The cat sat on the mat ."], [["the cat sat on the mat ."]]
# Tolerances: exact values, hand-computed floats, README values rounded to 2 decimals.
EXACT, HAND, README = 1e-9, 1e-6, 0.005

# case id -> (hypotheses, reference streams, {metric: expected score}, tolerance)
GOLDEN = {
    "identical": (
        SAME,
        [SAME],
        {"BLEU": 100.0, "chrF": 100.0, "TER": 0.0, LOWERCASED_BLEU: 100.0},
        EXACT,
    ),
    # No shared word and no shared character; TER = 4 substitutions / 4 ref words.
    "disjoint": (
        ["a b c d"],
        [["w x y z"]],
        {"BLEU": 0.0, "chrF": 0.0, "TER": 100.0},
        EXACT,
    ),
    # TER = one insertion ("red") / 7 reference words.
    "brevity": (CAT_HYP, CAT_REF, {"BLEU": CAT_BLEU, "TER": 100 / 7}, HAND),
    # TER = one substitution / 2 reference words.
    "char": (["the cat"], [["the cats"]], {"chrF": CATS_CHRF, "TER": 50.0}, HAND),
    # sacrebleu's TER is case-insensitive by default (its signature says "case:lc").
    "case": (
        CASE_HYP,
        CASE_REF,
        {"BLEU": CASED_BLEU, LOWERCASED_BLEU: 100.0, "TER": 0.0},
        HAND,
    ),
    "readme": (README_HYPS, README_REFS, {"BLEU": 48.53, "chrF": 59.73}, README),
}
GOLDEN_ROWS = [
    pytest.param(hyps, refs, metric, expected, tolerance, id=f"{case}-{metric}")
    for case, (hyps, refs, table, tolerance) in GOLDEN.items()
    for metric, expected in table.items()
]


def scores_by_name(result: EvalResult) -> dict[str, float]:
    return {s.name: s.score for s in result.scores}


@pytest.mark.parametrize(("hyps", "refs", "metric", "expected", "tolerance"), GOLDEN_ROWS)
def test_golden_scores(hyps, refs, metric, expected, tolerance):
    scores = scores_by_name(score_corpus(hyps, refs))
    assert scores[metric] == pytest.approx(expected, abs=tolerance)


def test_reports_the_four_metrics_in_order():
    result = score_corpus(SAME, [SAME])
    assert [s.name for s in result.scores] == [
        "BLEU",
        "chrF",
        "TER",
        "BLEU (lowercased, tokenized)",
    ]
    assert result.num_sentences == 2


def test_lowercased_bleu_ignores_a_case_only_difference():
    scores = scores_by_name(score_corpus(["The Cat sat ON the mat"], [["the cat sat on the mat"]]))
    assert scores["BLEU"] < 100.0
    assert scores[LOWERCASED_BLEU] == pytest.approx(100.0)


def test_a_second_reference_raises_the_score():
    hyps = ["the cat sat on the mat"]
    one = scores_by_name(score_corpus(hyps, [["the cat sat on the red mat"]]))
    two = scores_by_name(score_corpus(hyps, [["the cat sat on the red mat"], ["the cat sat on the mat"]]))
    assert two["BLEU"] > one["BLEU"]
    assert two["chrF"] > one["chrF"]
    assert two["TER"] < one["TER"]


@pytest.mark.parametrize(
    ("metric", "signature"),
    [
        ("BLEU", f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{VERSION}"),
        ("chrF", f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{VERSION}"),
        (
            "TER",
            f"nrefs:1|case:lc|tok:tercom|norm:no|punct:yes|asian:no|version:{VERSION}",
        ),
        (
            LOWERCASED_BLEU,
            f"nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:{VERSION}",
        ),
    ],
)
def test_signatures_are_sacrebleus_strings(metric, signature):
    result = score_corpus(SAME, [SAME])
    assert {s.name: s.signature for s in result.scores}[metric] == signature


def test_signatures_count_two_references():
    result = score_corpus(README_HYPS, README_REFS)
    for score in result.scores:
        assert score.signature.startswith("nrefs:2|"), score


@pytest.mark.parametrize(("missing", "reference"), [(0, 1), (1, 2)])
def test_mismatched_lengths_name_the_counts(missing, reference):
    hyps = [f"sentence {i}" for i in range(10)]
    refs = [list(hyps), list(hyps)]
    refs[missing].pop()
    with pytest.raises(MtkitError, match=f"^hypotheses have 10 lines but reference {reference} has 9; "):
        score_corpus(hyps, refs)


def test_no_references_is_an_error():
    with pytest.raises(MtkitError, match="no references"):
        score_corpus(["a"], [])


def test_no_hypotheses_is_an_error():
    with pytest.raises(MtkitError, match="no hypotheses"):
        score_corpus([], [[]])


def test_to_dict_round_trips_through_json():
    result = score_corpus(README_HYPS, README_REFS)
    data = result.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["num_sentences"] == 3
    assert data["scores"]["BLEU"]["score"] == pytest.approx(48.53, abs=0.005)
    assert data["scores"]["BLEU"]["signature"] == f"nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:{VERSION}"
    assert list(data["scores"]) == [s.name for s in result.scores]


def test_format_prints_one_labelled_line_per_metric():
    result = score_corpus(README_HYPS, README_REFS)
    lines = result.format().splitlines()
    assert len(lines) == len(result.scores)
    for line, score in zip(lines, result.scores, strict=True):
        assert line.startswith(score.name)
        assert f"{score.score:.2f}" in line
        assert line.endswith(score.signature)
    assert "48.53" in lines[0]
    assert "59.73" in lines[1]


def test_read_lines_strips_newlines_and_keeps_blank_lines(tmp_path):
    path = tmp_path / "hyp.txt"
    path.write_bytes("\ufeffone\r\n\r\nthree \u2028 still three\nfour".encode())
    assert read_lines(path) == ["one", "", "three \u2028 still three", "four"]


def test_read_lines_final_newline_does_not_add_a_line(tmp_path):
    path = tmp_path / "hyp.txt"
    path.write_text("a\nb\n", encoding="utf-8")
    assert read_lines(path) == ["a", "b"]
    (tmp_path / "empty.txt").write_bytes(b"")
    assert read_lines(tmp_path / "empty.txt") == []


def test_read_lines_missing_file(tmp_path):
    path = tmp_path / "nope.txt"
    with pytest.raises(MtkitError, match=f"^{re.escape(str(path))}: file not found; "):
        read_lines(path)


def test_read_lines_directory(tmp_path):
    with pytest.raises(MtkitError, match=f"^{re.escape(str(tmp_path))}: is a directory; "):
        read_lines(tmp_path)


def test_read_lines_bad_bytes_name_the_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"fine\nalso fine\ncaf\xe9\nlast\n")
    with pytest.raises(MtkitError) as info:
        read_lines(path)
    assert str(info.value) == f"{path}:3: not valid UTF-8 (byte 0xe9 at column 4); convert the file to UTF-8"


def test_every_option_that_names_a_metric_names_a_row_of_the_table():
    from mtkit.config import TrainConfig
    from mtkit.options import MbrUtility, QualityMetric

    validate = dataclasses.fields(TrainConfig)
    choices = next(f for f in validate if f.name == "validate_metric").metadata["choices"]
    named = {*(m.value for m in QualityMetric), *(u.value for u in MbrUtility), *choices}
    assert named <= set(METRICS)
    assert {row.name for row in METRICS.values()} >= {"BLEU", "chrF", "TER", LOWERCASED_BLEU, "COMET", "COMET-QE"}
    assert [row.key for row in METRICS.values()] == list(METRICS)


def test_a_row_added_first_changes_no_other_metrics_score(monkeypatch):
    """Scores are read from the table by name, so a metric added anywhere leaves what "BLEU" means alone."""
    from mtkit.evaluation import metrics

    hyps, refs = README_HYPS, README_REFS
    before = score_corpus(hyps, refs).to_dict()["scores"]
    added = metrics.MetricRow(key="chrf_word", name="chrF++", higher_is_better=True, digits=2, needs_references=True,
                              paired=False, sacrebleu="CHRF", options=(("word_order", 2),))  # fmt: skip
    monkeypatch.setattr(metrics, "METRICS", {"chrf_word": added, **metrics.METRICS})
    after = score_corpus(hyps, refs).to_dict()["scores"]
    assert {name: after[name] for name in before} == before
    assert list(after)[0] == "chrF++" and after["chrF++"]["score"] != before["chrF"]["score"]
    assert metrics.bleu(hyps, refs[0]) == sacrebleu.corpus_bleu(hyps, [refs[0]]).score
    assert metrics.metric_named("TER").higher_is_better is False
    with pytest.raises(MtkitError, match="metric 'BLUE': not one mtkit reports"):
        metrics.metric_named("BLUE")
