"""The sentence splitter in front of the model (`--split-by sentences`): a paragraph cut into its sentences and
rebuilt with its own spacing, exactly; the translator translating the sentences of every line together, one output
line per input line, with n-best lists, prefixes, constraints and word alignments over the whole line."""

from __future__ import annotations

from pathlib import Path

import pytest
from copy_translator import copy_translator
from hypothesis import given
from hypothesis import strategies as st

from mtkit.decoding.line_parts import LineParts, joined
from mtkit.decoding.options import Decoding, FileOptions
from mtkit.decoding.terminology.terms import Term
from mtkit.documents.files import DocumentOptions, translate_document_file
from mtkit.documents.pipeline import translate_texts
from mtkit.documents.sentences import SentenceSplitter, sentence_splitter, split_sentences, splitter_language
from mtkit.errors import MtkitError
from mtkit.options import SplitBy

PARAGRAPH = "Ein Hund läuft.  Zwei Männer stehen am Strand!\tWas machen sie? Dr. Müller kommt."
SPLITTER = SentenceSplitter("de")


def test_a_paragraph_is_cut_into_its_sentences_with_the_spacing_between_them():
    parts = split_sentences(" " + PARAGRAPH + "  ", "de")
    assert parts.parts == ("Ein Hund läuft.", "Zwei Männer stehen am Strand!", "Was machen sie?", "Dr. Müller kommt.")
    assert parts.spaces == (" ", "  ", "\t", " ", "  ")


@pytest.mark.parametrize("text", ["", "   ", "\t \u00a0"])
def test_a_line_of_whitespace_alone_has_no_sentence(text):
    parts = split_sentences(text, "en")
    assert parts.parts == () and parts.text() == text


TEXT = st.lists(st.sampled_from([*"ab Z.!?。\t\u00a0\u3000\n", "Dr.", "z. B.", "日本", "\U0001f600", "\ud800"]), max_size=30).map(
    "".join
)


def test_a_no_break_space_before_a_full_stop_is_read_safely():
    assert split_sentences("Z\u00a0.", "en").parts == ("Z\u00a0.",)  # sentencex alone panics on it


@given(text=TEXT, language=st.sampled_from(["de", "en", "ja", "zz"]))
def test_splitting_and_rebuilding_keep_the_text_exactly(text, language):
    parts = split_sentences(text, language)
    assert parts.text() == text
    assert len(parts.spaces) == len(parts.parts) + 1
    assert all(part and part == part.strip() for part in parts.parts)
    assert all(not space.strip() for space in parts.spaces)


def test_languages_are_named_as_sentencex_names_them():
    assert [splitter_language(name) for name in ("de", "de-DE", "deu_Latn", "zho_Hans", "xx")] == ["de", "de", "de", "zh", "xx"]
    # German's rules know its abbreviations; a language sentencex lacks falls back as sentencex does (to English's)
    assert len(split_sentences("Er kam am 3. Mai. Ja.", "de").parts) == 2
    assert split_sentences("The dog runs. The cat sleeps.", "zz").parts == ("The dog runs.", "The cat sleeps.")


def test_translations_of_sentences_are_joined_by_the_source_spacing():
    assert joined(["A dog.", "Two men."], ["\t"]) == "A dog.\tTwo men."
    assert joined(["A dog.", "Two men."], [""]) == "A dog. Two men."  # a Japanese source: no space between sentences
    assert joined(["犬です。", "猫です。"], [""]) == "犬です。猫です。"
    assert joined([], []) == ""


def test_the_splitter_follows_the_flag_then_the_recipe():
    translator = copy_translator(split_by="lines")
    assert sentence_splitter(translator, split_by=None, language="de") is None
    assert sentence_splitter(translator, split_by=SplitBy.SENTENCES, language="deu_Latn") == SentenceSplitter("de")
    assert sentence_splitter(copy_translator(), split_by=None, language=None) == SentenceSplitter("en")
    assert sentence_splitter(copy_translator(), split_by="lines", language=None) is None


def test_the_sentences_of_all_lines_are_translated_together_one_output_line_per_input_line():
    translator = copy_translator()
    lines = [PARAGRAPH, "", "   ", "Nur ein Satz.", " Vorne. Hinten. "]
    found = translator.translate_nbest(lines, Decoding(beam=2), splitter=SPLITTER)
    assert [best[0].text for best in found] == [PARAGRAPH, "", "", "Nur ein Satz.", "Vorne. Hinten."]
    assert len(translator.engine.batches) == 1 and len(translator.engine.batches[0].sources) == 4 + 1 + 2
    whole = translator.translate_nbest(lines, Decoding(beam=2))
    assert [best[0].text for best in whole][0] == " ".join(PARAGRAPH.split())  # the model's own spacing, one piece
    assert len(translator.engine.batches[-1].sources) == 3


def test_nbest_lists_join_each_sentences_kth_translation():
    found = copy_translator().translate_nbest(["Ein Hund. Zwei Katzen."], Decoding(beam=3, nbest=3), splitter=SPLITTER)
    assert [t.text for t in found[0]] == ["Ein Hund. Zwei Katzen.", "Ein Hund Zwei Katzen", "Ein Hun Zwei Katze"]
    assert [t.score for t in found[0]] == [0.0, -2.0, -4.0]


def test_a_prefix_goes_with_the_first_sentence():
    translator = copy_translator()
    found = translator.translate_nbest(["Ein Hund. Zwei Katzen."], Decoding(beam=2), prefixes=["Der"], splitter=SPLITTER)
    assert found[0][0].text == "Der Ein Hund. Zwei Katzen."
    prefixes = translator.engine.batches[-1].prefixes
    assert sorted(map(len, prefixes)) == [0, len(translator.target_prefix("Der"))]


def test_a_glossary_term_goes_with_the_sentence_holding_its_source_term():
    translator = copy_translator()
    term = Term(alternatives=("cat",), source="Katzen", where="g.tsv:1")
    translator.translate_nbest(["Ein Hund. Zwei Katzen."], Decoding(beam=2), constraints=[[term]], splitter=SPLITTER)
    batch = translator.engine.batches[-1]
    texts = [translator.tokenizers.src.decode(source) for source in batch.sources]
    terms = dict(zip(texts, batch.terms.constraints, strict=True))
    assert terms["Ein Hund."] == [] and terms["Zwei Katzen."] == [[translator.tokenizers.tgt.encode("cat")]]


def test_a_constraint_without_a_source_term_in_a_cut_paragraph_says_how_to_place_it():
    with pytest.raises(MtkitError, match=r"line 1: the line is translated sentence by sentence .*--split-by lines$"):
        copy_translator().translate_nbest(["Ein Hund. Zwei Katzen."], Decoding(beam=2), constraints=[["cat"]], splitter=SPLITTER)
    found = copy_translator().translate_nbest(["Ein Hund."], Decoding(beam=2), constraints=[["cat"]], splitter=SPLITTER)
    assert found[0][0].text == "Ein Hund."  # one sentence: the line's terms go with it


def test_word_alignments_number_the_words_of_the_whole_line():
    found = copy_translator().translate_nbest(["Ein Hund.  Zwei Katzen."], Decoding(beam=2, alignments=True), splitter=SPLITTER)
    assert found[0][0].alignment == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert found[0][0].source_alignment == [(0, 0), (1, 1), (2, 2), (3, 3)]  # the second sentence's point past the first's


def test_a_sentence_longer_than_max_input_tokens_is_cut_again_and_counted_as_such():
    translator = copy_translator(max_input_tokens=12)
    plan = translator.plan(["Ein Hund läuft über die Wiese. Ja.", "Ein Hund. Zwei."], splitter=SPLITTER)
    first, second = (len(segments) for segments in plan.segments_of_line)
    assert first >= 3 and second == 2 and plan.split_lines == 1


def test_the_work_of_a_line_counts_its_sentences():
    translator = copy_translator()
    whole, cut = (translator.plan([PARAGRAPH], Decoding(beam=2), splitter=s) for s in (None, SPLITTER))
    assert len(cut.sources) == 4 and cut.line_work[0] == cut.work > 0
    assert cut.work == 2 * sum(cut._cap(n) for n in range(4))


def test_translate_texts_reads_split_by_and_the_recipe(tmp_path: Path):
    translator = copy_translator(split_by="lines")
    assert translate_texts(translator, [PARAGRAPH], decoding=Decoding())[0][0].text == " ".join(PARAGRAPH.split())
    found = translate_texts(translator, [PARAGRAPH], decoding=Decoding(), split_by=SplitBy.SENTENCES, language="de")
    assert found[0][0].text == PARAGRAPH


@pytest.mark.parametrize(("split_by", "sources"), [(None, 5), (SplitBy.LINES, 2)])
def test_translate_splits_a_file_one_output_line_per_input_line(tmp_path: Path, split_by, sources):
    source = tmp_path / "in.txt"
    source.write_text("Ein Hund. Zwei Katzen.\n\nDrei.\tVier.  Fünf.\n", encoding="utf-8")
    output = tmp_path / "out.txt"
    translator = copy_translator()
    options = DocumentOptions(file=FileOptions(input=source, output=output), split_by=split_by)
    assert translate_document_file(translator, options) == 3
    expected = ["Ein Hund. Zwei Katzen.", "", "Drei.\tVier.  Fünf." if split_by is None else "Drei. Vier. Fünf."]
    assert output.read_text(encoding="utf-8").splitlines() == expected
    assert sum(len(batch.sources) for batch in translator.engine.batches) == sources


def test_line_parts_rebuild_their_line():
    assert LineParts.whole(" a. b ").text() == " a. b "
    assert LineParts(("a.", "b"), (" ", "\t", "")).text() == " a.\tb"


def test_the_recipe_key_sets_what_translate_does_without_the_flag(tmp_path: Path):
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text(PARAGRAPH + "\n", encoding="utf-8")
    for split_by, searched in (("sentences", 4), ("lines", 1)):
        translator = copy_translator(split_by=split_by)
        translate_document_file(translator, DocumentOptions(file=FileOptions(input=source, output=output)))
        assert sum(len(batch.sources) for batch in translator.engine.batches) == searched
