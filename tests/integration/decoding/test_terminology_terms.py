"""Terminology end to end: constrained translation with the reverse-task model (the target is the source's
letters in reverse order), through the API and `translate`'s constraints files and glossaries."""

from __future__ import annotations

import dataclasses
import re

import pytest
from helpers import cli_output, write_text_lines
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.decoding.options import Decoding, Sampling
from mtkit.decoding.terminology.terms import Term, as_terms
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError


def words(text: str) -> list[str]:
    return text.split()


def test_constrained_translations_contain_their_terms_and_others_are_unchanged(reverse_pytorch):
    lines = ["a b c d", "e f g", "h i j k l", "a c e"]
    constraints = [["l"], [], [["a", "b"]], ["g", "b"]]
    decoding = Decoding(beam=4, nbest=2, length_penalty=0.0)  # scores are log-probabilities
    plain = reverse_pytorch.translate_nbest(lines, decoding)
    found = reverse_pytorch.translate_nbest(lines, decoding, constraints=constraints)
    assert [t.text for t in found[1]] == [t.text for t in plain[1]]  # no constraints: unchanged
    for translations, terms in zip(found, constraints, strict=True):
        for translation in translations:
            assert translation.unmet == []
            for term in as_terms(terms, "test"):
                assert any(alternative in words(translation.text) for alternative in term.alternatives), translation.text
    scores = reverse_pytorch.score(lines, [t[0].text for t in found])
    for translations, pair in zip(found, scores, strict=True):
        assert abs(translations[0].score - pair.log_prob) < 1e-3 * max(1.0, abs(pair.log_prob))


def test_no_constraints_change_nothing_and_terms_work_with_prefixes_and_ensembles(reverse_pytorch, reverse_run):
    lines, decoding = ["a b c d", "e f g"], Decoding(beam=3, nbest=3, no_repeat_ngram=2)
    plain = reverse_pytorch.translate_nbest(lines, decoding)
    empty = reverse_pytorch.translate_nbest(lines, decoding, constraints=[[], []])
    assert [[(t.tokens, t.score) for t in line] for line in empty] == [[(t.tokens, t.score) for t in line] for line in plain]
    prefixed = reverse_pytorch.translate_nbest(lines, decoding, prefixes=["k", ""], constraints=[["l"], ["a"]])
    assert all(words(t.text)[0] == "k" and "l" in words(t.text) for t in prefixed[0])
    assert all("a" in words(t.text) for t in prefixed[1])
    ensemble = Translator.load([reverse_run.run_path, reverse_run.run_path])
    assert "l" in words(ensemble.translate_nbest(lines, decoding, constraints=[["l"], []])[0][0].text)


def test_given_order_puts_terms_in_order(reverse_pytorch):
    found = reverse_pytorch.translate_nbest(["a b c d"], Decoding(beam=5, constraints_in_order=True), constraints=[["a", "d"]])
    output = words(found[0][0].text)
    last_d = len(output) - 1 - output[::-1].index("d") if "d" in output else -1  # "d c b a d" has them in order
    assert "a" in output and output.index("a") < last_d, output


def test_the_translate_api_takes_constraints(reverse_pytorch):
    assert "l" in words(reverse_pytorch.translate(["a b c"], beam=3, constraints=[["l"]])[0])


@pytest.mark.parametrize(
    ("decoding", "says"),
    [
        (Decoding(beam=1), r"need beam search, not greedy search \(beam 1\)"),
        (Decoding(sampling=Sampling()), "not --sampling"),
    ],
)
def test_constraints_without_beam_search_are_refused(reverse_pytorch, decoding, says):
    with pytest.raises(MtkitError, match=says):
        reverse_pytorch.translate_nbest(["a b c"], decoding, constraints=[["a"]])


def test_bad_constraints_name_the_line(reverse_pytorch):
    with pytest.raises(MtkitError, match=r"constraints for 1 lines, but 2 lines"):
        reverse_pytorch.translate_nbest(["a", "b"], Decoding(beam=2), constraints=[["a"]])
    with pytest.raises(MtkitError, match=r"^line 2: the model's target vocabulary cannot write 'ж'"):
        reverse_pytorch.translate_nbest(["a", "b"], Decoding(beam=2), constraints=[[], ["ж"]])


def test_a_long_line_with_constraints_needs_their_source_terms(reverse_pytorch):
    short = dataclasses.replace(reverse_pytorch.decode, max_input_tokens=8)
    cut = Translator(reverse_pytorch.engine, reverse_pytorch.tokenizers, decode=short, normalize=reverse_pytorch.normalize)
    line = "a b c d e. f g h i j."
    with pytest.raises(MtkitError, match="line 1: the line is longer than decode.max_input_tokens"):
        cut.translate_nbest([line], Decoding(beam=3), constraints=[["l"]])
    found = cut.translate_nbest([line], Decoding(beam=3), constraints=[[Term(alternatives=("l",), source="g", where="g.tsv:1")]])
    assert "l" in words(found[0][0].text)


def test_the_ctranslate2_engine_refuses_constraints(reverse_export):
    exported = Translator.load(reverse_export)
    with pytest.raises(MtkitError, match="needs lexical constraints, which the ctranslate2 engine lacks"):
        exported.translate_nbest(["a b"], Decoding(beam=2), constraints=[["a"]])


def test_an_empty_line_with_constraints_still_gets_them(reverse_pytorch):
    found = reverse_pytorch.translate_nbest(["", "a b"], Decoding(beam=3), constraints=[["c"], []])
    assert "c" in words(found[0][0].text)


def test_translate_takes_a_constraints_file_and_a_glossary(reverse_run, tmp_path):
    source = write_text_lines(tmp_path / "in.txt", ["a b c", "d e f", "g h"])
    constraints = write_text_lines(tmp_path / "c.jsonl", ['["l"]', "[]", '[["k", "j"]]'])
    glossary = write_text_lines(tmp_path / "g.tsv", ["e\ti", "nowhere\tk"])
    run = reverse_run.run_path
    out = cli_output("translate", "-m", run, "-i", source, "--beam", 4, "--constraints", constraints, "--glossary", glossary)
    first, second, third = (words(line) for line in out.splitlines())
    assert "l" in first and "i" in second and ("k" in third or "j" in third), out
    order = ("--constraints-order", "given")
    given = cli_output("translate", "-m", run, "-i", source, "--beam", 4, "--constraints", constraints, *order)
    assert "l" in words(given.splitlines()[0])


@pytest.mark.parametrize(
    ("lines", "extra", "says"),
    [
        (['["l"]', "[]"], [], r"--constraints .*c\.jsonl has 2 lines but .*in\.txt has 3"),
        (['["l"]', "[", "[]"], [], r"c\.jsonl:2: not JSON"),
        (['["l"]', '["ж"]', "[]"], [], r"c\.jsonl:2: the model's target vocabulary cannot write 'ж'"),
        (['["l"]', '[""]', "[]"], [], r"c\.jsonl:2: an empty phrase"),
        (['["l"]', "[]", "[]"], ["--beam", "1"], r"--constraints need beam search, not greedy search"),
    ],
)
def test_a_bad_constraints_file_is_one_line_naming_it_before_any_output(reverse_run, tmp_path, lines, extra, says):
    source = write_text_lines(tmp_path / "in.txt", ["a b c", "d e f", "g h"])
    constraints = write_text_lines(tmp_path / "c.jsonl", lines)
    output = tmp_path / "out.txt"
    arguments = ["translate", "-m", reverse_run.run_path, "-i", source, "-o", output, "--constraints", constraints, *extra]
    result = CliRunner().invoke(app, [str(a) for a in arguments])
    assert result.exit_code != 0 and re.search(says, result.output), result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not output.exists()
