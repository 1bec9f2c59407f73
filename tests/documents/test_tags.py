"""Tag placement by word alignments (`place_spans`) and a block written with its markup (`markup`), on alignments
written by hand and on generated ones (every span exactly once, the output nested)."""

from __future__ import annotations

import gzip
import html
import itertools
import re

import pytest
from helpers import MULTI30K
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtkit.data.tokenizer import Tokenizer, train_sentencepiece
from mtkit.decoding.alignment import word_indices
from mtkit.decoding.translator import Translation
from mtkit.documents.blocks import Block, Span, SpanKind
from mtkit.documents.tags import markup, place_spans, words
from mtkit.textio import model_text

TAG = re.compile(r"<(/?)(\w+)(?: [^<>/]*)?(/?)>")


def tagged(source: str) -> Block:
    """A block from `a <b>b</b> c<br/>`: the text without tags, each tag a span (an empty one for `<x/>`)."""
    text, spans, opened = "", [], []
    last = 0
    for match in TAG.finditer(source):
        text += source[last : match.start()]
        last = match.end()
        closing, name, empty = match.groups()
        if empty:
            spans.append([len(text), len(text), match.group(), ""])
        elif closing:
            spans[opened.pop()][1:4:2] = [len(text), match.group()]
        else:
            opened.append(len(spans))
            spans.append([len(text), None, match.group(), None])
    text += source[last:]
    return Block(text=text, spans=tuple(Span(start=s, end=e, open=o, close=c) for s, e, o, c in spans))


def placed(source: str, target: str, alignment: list[tuple[int, int]]) -> str:
    translation = Translation(text=target, score=0.0, tokens=[], alignment=alignment)
    return markup(place_spans(tagged(source), translation), escape=lambda text: text)


def reversed_pairs(count: int) -> list[tuple[int, int]]:
    return [(source, count - 1 - source) for source in range(count)]


def test_a_tag_goes_around_the_words_its_words_align_to() -> None:
    assert placed("<b>a</b> b c", "c b a", reversed_pairs(3)) == "c b <b>a</b>"
    assert placed("<b>a <i>b</i></b> c", "c b a", reversed_pairs(3)) == "c <b><i>b</i> a</b>"
    assert placed('<a href="x">a b</a> c', "B A C", [(0, 1), (1, 0), (2, 2)]) == '<a href="x">B A</a> C'


def test_the_source_to_target_links_place_the_tags_where_there_are_some() -> None:
    translation = Translation(
        text="c b a", score=0.0, tokens=[], alignment=[(0, 0), (1, 1), (2, 2)], source_alignment=reversed_pairs(3)
    )
    assert markup(place_spans(tagged("<b>a</b> b c"), translation), escape=lambda text: text) == "c b <b>a</b>"


def test_a_hull_covers_the_words_between_aligned_ones() -> None:
    assert placed("<b>a b</b> c", "A C B", [(0, 0), (1, 2), (2, 1)]) == "<b>A C B</b>"


def test_crossing_siblings_are_kept_apart_and_a_child_is_clipped_inside_its_parent() -> None:
    out = placed("<b>a</b> <i>b <u>c</u></i>", "x y z", [(0, 0), (0, 1), (1, 2), (2, 1)])
    assert out == "<b>x y</b> <i><u></u>z</i>"


def test_an_empty_element_goes_after_the_target_of_the_word_before_it() -> None:
    assert placed("a b<br/> c", "C B A", reversed_pairs(3)) == "C B <br/>A"
    assert placed("<br/>a b", "B A", reversed_pairs(2)) == "<br/>B A"


def test_a_tag_with_no_aligned_word_goes_after_the_nearest_aligned_word_before_it() -> None:
    assert placed("a <b>b</b> c", "A C", [(0, 0), (2, 1)]) == "A <b></b>C"
    assert placed("<b>a</b> b", "B", []) == "<b></b>B"


def test_placeholders_are_written_escaped_and_tags_as_they_are() -> None:
    block = Block(
        text="a < b",
        spans=(Span(start=0, end=1, open="<b>", close="</b>"), Span(start=5, end=5, open="%s&", kind=SpanKind.PLACEHOLDER)),
    )
    assert markup(block, escape=html.escape) == "<b>a</b> &lt; b%s&amp;"


def test_a_block_without_spans_is_the_translation() -> None:
    translation = Translation(text="x y", score=0.0, tokens=[])
    assert place_spans(Block(text="a b"), translation) == Block(text="x y")


@st.composite
def blocks_and_translations(draw: st.DrawFn) -> tuple[Block, Translation]:
    words = draw(st.lists(st.sampled_from(["a", "bb", "ccc"]), min_size=1, max_size=6))
    starts = [sum(len(w) + 1 for w in words[:i]) for i in range(len(words) + 1)]
    ends = [0, *(start + len(w) for start, w in zip(starts, words, strict=False))]
    candidates = draw(st.lists(st.tuples(st.integers(0, len(words)), st.integers(0, len(words))), max_size=8))
    accepted: list[tuple[int, int]] = []
    for first, last in candidates:
        start, end = (starts[first], ends[last]) if first < last else (ends[first], ends[first])
        if start <= end and all(
            end <= s or e <= start or (s <= start and end <= e) or (start <= s and e <= end) for s, e in accepted
        ):
            accepted.append((start, end))
    accepted.sort(key=lambda span: (span[0], -span[1]))
    spans = tuple(Span(start=s, end=e, open=f"<t{i}>", close=f"</t{i}>" if e > s else "") for i, (s, e) in enumerate(accepted))
    targets = draw(st.integers(0, 7))
    pairs = draw(st.lists(st.tuples(st.integers(0, len(words)), st.integers(0, targets)), max_size=12))
    text = " ".join(["x"] * targets)
    return Block(text=" ".join(words), spans=spans), Translation(text=text, score=0.0, tokens=[], alignment=pairs)


@settings(max_examples=300, deadline=None)
@given(blocks_and_translations())
def test_every_span_comes_back_once_and_the_output_nests(case: tuple[Block, Translation]) -> None:
    block, translation = case
    out = place_spans(block, translation)
    assert sorted(s.open for s in out.spans) == sorted(s.open for s in block.spans)
    assert all(0 <= s.start <= s.end <= len(out.text) for s in out.spans)
    for one in out.spans:
        for other in out.spans:
            apart = one.end <= other.start or other.end <= one.start
            assert (
                apart
                or (one.start <= other.start and other.end <= one.end)
                or (other.start <= one.start and one.end <= other.end)
            )
    written = markup(out, escape=lambda text: text)
    assert TAG.sub("", written) == out.text
    stack = []
    for match in TAG.finditer(written):
        closing, name, _ = match.groups()
        if closing:
            assert stack.pop() == name
        elif block.spans[int(name[1:])].close:
            stack.append(name)
    assert not stack


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    with gzip.open(MULTI30K / "train.de.gz", "rt", encoding="utf-8") as lines:
        return train_sentencepiece(itertools.islice(lines, 2000), 500)


TRICKY = "ab é\u0301\u00a8\u00a0\u200b\u200c\u2581\ufeff\ufffd\u3000\x07\x0b\x1c\x85\x7f\t\ufb01\u2460"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=TRICKY, max_size=12))
def test_the_words_of_a_text_are_those_of_its_sentencepiece_pieces(tokenizer: Tokenizer, text: str) -> None:
    pieces = tokenizer.id_to_piece(tokenizer.encode(model_text(text, "NFC")))
    assert len(words(text)) == len(set(word_indices(pieces)))
