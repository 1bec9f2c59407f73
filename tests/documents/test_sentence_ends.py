"""Sentence ends with no punctuation, learnt from a corpus's sentences (RUN/sentence_ends.tsv): a paragraph whose
sentences lack their full stops is still cut between them, and a sentence is not cut before a word that goes on it."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mtkit.documents import sentence_ends
from mtkit.documents.sentence_ends import SentenceEnds, load_sentence_ends, save_sentence_ends, sentence_ends_of
from mtkit.documents.sentences import SentenceSplitter, split_sentences
from mtkit.errors import MtkitError

SUBJECTS = ("Ein Hund", "Eine Frau", "Zwei Männer", "Ein Kind", "Drei Mädchen")
VERBS = ("läuft", "steht", "sitzt", "spielt", "wartet")
PLACES = ("auf der Wiese", "am Strand", "in der Stadt", "im Park", "vor dem Haus", "an der Straße")


def captions() -> list[str]:
    """A made-up corpus of captions, each ending with a full stop, as most training sentences do."""
    return [f"{s} {v} {p}." for s, v, p in itertools.product(SUBJECTS, VERBS, PLACES)]


@pytest.fixture(scope="module")
def ends() -> SentenceEnds:
    return SentenceEnds.learn(captions(), info={"lines": len(captions())})


def test_two_sentences_without_their_full_stops_are_cut_where_the_second_starts(ends):
    paragraph = "Ein Hund läuft im Park Zwei Männer stehen am Strand Eine Frau wartet."
    assert split_sentences(paragraph, "de").parts == (paragraph,)  # the rules see one sentence
    parts = split_sentences(paragraph, "de", ends=ends)
    assert parts.parts == ("Ein Hund läuft im Park", "Zwei Männer stehen am Strand", "Eine Frau wartet.")
    assert parts.text() == paragraph


def test_a_sentence_is_not_cut_before_a_word_that_goes_on_it(ends):
    for caption in captions():
        assert split_sentences(caption, "de", ends=ends).parts == (caption,)
    # "Park" is capitalised like a sentence's first word, but the corpus has it after "im"
    assert SentenceSplitter("de", ends=ends).cut("Ein Kind spielt im Park").parts == ("Ein Kind spielt im Park",)


def test_a_cut_leaves_a_few_words_on_each_side_and_never_cuts_inside_a_word(ends):
    assert split_sentences("Hund Ein Hund", "de", ends=ends).parts == ("Hund Ein Hund",)
    assert split_sentences("Ein Hund läuft im Park-Ein Kind spielt", "de", ends=ends).parts == (
        "Ein Hund läuft im Park-Ein Kind spielt",
    )


def test_the_model_is_written_and_read_back_the_same(ends, tmp_path):
    path = tmp_path / "sentence_ends.tsv"
    save_sentence_ends(path, ends)
    back = load_sentence_ends(path)
    assert back.pairs == ends.pairs and back.info == {"lines": len(captions())}
    assert back.cuts("Ein Hund läuft im Park Zwei Männer stehen") == ends.cuts("Ein Hund läuft im Park Zwei Männer stehen")
    assert sentence_ends_of(tmp_path).pairs == ends.pairs  # a run or an export directory holding the file
    assert sentence_ends_of(tmp_path / "elsewhere") is None


def test_a_bad_or_oversized_file_is_one_line_naming_it(tmp_path, monkeypatch):
    bad = tmp_path / "sentence_ends.tsv"
    bad.write_text("# mtkit sentence ends {}\nEin\tHund\t3\nHund\tläuft\n", encoding="utf-8")
    with pytest.raises(MtkitError, match=r"sentence_ends.tsv, line 3: 'Hund\\tläuft' is not 'word TAB next word TAB count'"):
        load_sentence_ends(bad)
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(MtkitError, match=r"sentence_ends.tsv: not UTF-8 text at byte 0; build it again"):
        load_sentence_ends(bad)
    monkeypatch.setattr(sentence_ends, "MOST_BYTES", 1)
    with pytest.raises(MtkitError, match=r"sentence_ends.tsv: 2 bytes, more than the 1 such a file may hold"):
        load_sentence_ends(bad)


WORDS = st.sampled_from(["Ein", "Hund", "läuft", "im", "Park", "Zwei", ".", "!", " ", "  ", "\t", "-", "\u00a0", "z. B."])


@given(text=st.lists(WORDS, max_size=40).map("".join))
def test_with_the_ends_splitting_and_rebuilding_keep_the_text_exactly(text):
    found = split_sentences(text, "de", ends=SentenceEnds.learn(captions()))
    assert found.text() == text
    assert all(part and part == part.strip() for part in found.parts)
    assert len(found.parts) >= len(split_sentences(text, "de").parts)
