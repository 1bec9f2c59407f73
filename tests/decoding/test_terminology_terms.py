"""Terminology's inputs: constraint lists and files, glossaries, whole-word matching and where the terms of a
segmented line go (constrained translation end to end: tests/integration/decoding/)."""

from __future__ import annotations

import re

import pytest
from helpers import write_text_lines

from mtkit.decoding.terminology.terms import Glossary, Term, as_terms, contains_term, parse_constraints, place_terms
from mtkit.errors import MtkitError


def test_a_constraints_line_is_a_json_list_of_phrases_or_alternatives():
    terms = parse_constraints('["Fahrrad", ["Hund", " Hunde "]]', "c.jsonl:3")
    assert terms == [Term(alternatives=("Fahrrad",), where="c.jsonl:3"), Term(alternatives=("Hund", "Hunde"), where="c.jsonl:3")]
    assert parse_constraints("", "c.jsonl:4") == [] and parse_constraints("[]", "c.jsonl:5") == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('["Hund"', "not JSON"),
        ('{"a": 1}', "is not a list"),
        ('["Hund", ""]', "an empty phrase"),
        ('[["Hund", 3]]', "is not a phrase or a list of phrases"),
        ("[[]]", "is not a phrase or a list of phrases"),
    ],
)
def test_a_bad_constraints_line_is_one_error_naming_the_file_and_line(text, says):
    with pytest.raises(MtkitError, match=rf"^c\.jsonl:7: .*{re.escape(says)}"):
        parse_constraints(text, "c.jsonl:7")


def test_the_api_takes_phrases_alternatives_or_terms():
    assert as_terms(["Hund", ["Katze", "Katzen"]], "line 1")[1].alternatives == ("Katze", "Katzen")
    with pytest.raises(MtkitError, match="line 2: constraints are a list of phrases"):
        as_terms("Hund", "line 2")


def test_glossary_terms_match_whole_words_in_any_case(tmp_path):
    path = write_text_lines(tmp_path / "g.tsv", ["# source\ttargets", "Hund\tdog\tdogs", "", "rote Auto\tred car"])
    glossary = Glossary.load(path)
    assert [t.alternatives for t in glossary.terms_for("Der HUND schläft.")] == [("dog", "dogs", "Dog", "Dogs")]
    assert glossary.terms_for("Die Hunde schlafen.") == []  # inside a longer word: not the term
    assert [t.source for t in glossary.terms_for("Das rote Auto, der Hund")] == ["Hund", "rote Auto"]
    assert glossary.terms_for("Der Hund")[0].where == f"{path}:2"
    assert contains_term("ein Hund.", "Hund") and not contains_term("Schäferhund", "hund")


@pytest.mark.parametrize("line", ["Hund", "Hund\t", "\tdog"])
def test_a_bad_glossary_line_is_one_error_naming_the_line(tmp_path, line):
    path = write_text_lines(tmp_path / "g.tsv", ["Katze\tcat", line])
    with pytest.raises(MtkitError, match=r"g\.tsv:2: .*a source term, a tab"):
        Glossary.load(path)


def test_terms_of_a_line_cut_into_segments_go_where_their_source_term_is():
    glossary_term = Term(alternatives=("dog",), source="Hund", where="g.tsv:1")
    placed = place_terms([["Die Katze schläft.", "Der Hund bellt."], ["Ein Satz."]], [[glossary_term], []])
    assert placed == [[], [glossary_term], []]
    with pytest.raises(MtkitError, match=r"line 1: .* translated in 2 segments"):
        place_terms([["a.", "b."]], [[Term(alternatives=("x",), where="line 1")]])


# The reverse task's words are single letters a-l; a model translates "a b c" as "c b a".
