"""The dropped-sentence flag: a source sentence no output word aligns to, read from the model's alignments with
`evaluate -m` (a stub engine that drops a sentence, and hand-built alignments), counted and written with --flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from copy_translator import copy_translator
from helpers import write_text_lines

from mtkit.decoding.line_parts import LineParts
from mtkit.decoding.translator import Translation
from mtkit.errors import MtkitError
from mtkit.evaluation import report
from mtkit.evaluation.dropped import dropped_lines, dropped_sentences, sentence_words
from mtkit.evaluation.report import EvaluateRequest, evaluate
from mtkit.options import SplitBy

PARAGRAPH = "Ein Hund. Zwei Katzen."


def test_a_sentence_no_output_word_aligns_to_is_dropped():
    assert dropped_sentences([2, 2], [(0, 0), (1, 1)]) == [1]
    assert dropped_sentences([2, 2], [(0, 0), (3, 1)]) == []
    assert dropped_sentences([2, 0, 1], [(1, 0)]) == [2]  # a sentence without words is never flagged
    assert dropped_sentences([2, 2], [(1, 0), (2, 1)], first_word=1) == [1]  # word 0 is the language tag


def test_a_sentence_only_a_stray_output_word_aligns_to_is_dropped():
    assert dropped_sentences([3, 4], [(0, 0), (1, 1), (2, 2), (5, 3)]) == [1]  # 1 of 4 words: a stray link
    assert dropped_sentences([3, 4], [(0, 0), (1, 1), (2, 2), (4, 3), (5, 4)]) == []  # 2 of 4: translated


def test_the_words_of_each_sentence_are_counted_as_alignments_number_them():
    translator = copy_translator()
    assert sentence_words(translator, LineParts(("Ein Hund.", "Zwei kleine Katzen."), ("", " ", ""))) == [2, 3]


def test_an_empty_output_is_not_flagged_dropped_but_a_partial_one_is():
    translator = copy_translator()
    parts = [LineParts(("Ein Hund.", "Zwei Katzen."), ("", " ", ""))] * 3
    outputs = [
        Translation(text="", score=0.0, tokens=[], alignment=[]),
        Translation(text="A dog.", score=0.0, tokens=[], alignment=[(0, 0), (1, 1)]),
        Translation(text="A dog. Two cats.", score=0.0, tokens=[], alignment=[(0, 0), (1, 1), (2, 2), (3, 3)]),
    ]
    assert dropped_lines(translator, parts, best=outputs, tagged=False) == [False, True, False]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "src": write_text_lines(tmp_path / "src.de", [PARAGRAPH, "Drei Mäuse."]),
        "ref": write_text_lines(tmp_path / "ref.en", ["A dog. Two cats.", "Three mice."]),
        "flags": tmp_path / "flags.tsv",
    }


@pytest.mark.parametrize(("split_by", "dropped"), [(SplitBy.LINES, 1), (SplitBy.SENTENCES, 0)])
def test_evaluate_counts_and_writes_the_dropped_sentences(files, monkeypatch, split_by, dropped):
    stub = copy_translator(drop=(PARAGRAPH,))  # given the paragraph whole, it stops after its first sentence
    monkeypatch.setattr(report.Translator, "load", classmethod(lambda cls, *args, **kwargs: stub))
    request = EvaluateRequest(
        models=[Path("stub")], src=files["src"], refs=[files["ref"]], flags_file=files["flags"], split_by=split_by
    )
    found = evaluate(request)
    assert found.systems[0].flags["dropped"] == dropped
    rows = files["flags"].read_text(encoding="utf-8").splitlines()[1:]
    assert [row.split("\t")[:2] for row in rows if "dropped" in row] == ([["1", "dropped"]] if dropped else [])


def test_without_a_model_the_flag_is_not_reported(files):
    found = evaluate(EvaluateRequest(hyps=[files["ref"]], refs=[files["ref"]], src=files["src"]))
    assert "dropped" not in found.systems[0].flags and "empty" in found.systems[0].flags


def test_split_by_without_a_model_is_refused_in_one_line(files):
    with pytest.raises(MtkitError, match=r"^--split-by lines says how -m translates; --hyp files are translated already"):
        evaluate(EvaluateRequest(hyps=[files["ref"]], refs=[files["ref"]], split_by=SplitBy.LINES))
