"""Placeholders are taken out of a block's text into empty spans (each style found, at the right offsets), and come
back once per occurrence through `tags.place_spans` over a stub translation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtkit.decoding.translator import Translation
from mtkit.documents.blocks import Block, Span, SpanKind
from mtkit.documents.placeholders import find_placeholders, mask_placeholders, space_placeholders
from mtkit.documents.tags import place_spans

# (source text, the text the model reads, each placeholder with its offset in that text); a span's `open` holds the
# placeholder with the whitespace taken out beside it
STYLES = [
    ("Delete %s now", "Delete now", [("%s", 7)]),
    ("Deleted %d of %5.2f files", "Deleted of files", [("%d", 8), ("%5.2f", 11)]),
    ("From %1$s to %2$s", "From to", [("%1$s", 5), ("%2$s", 7)]),
    ("Hello %(name)s, welcome", "Hello, welcome", [("%(name)s", 5)]),
    ("%(count)d files left", "files left", [("%(count)d", 0)]),
    ("Saved %lld bytes", "Saved bytes", [("%lld", 6)]),
    ("100%% sure", "100%% sure", []),
    ("50% of it", "50% of it", []),
    ("Open %1 in %2", "Open in", [("%1", 5), ("%2", 7)]),
    ("Hello {}", "Hello", [("{}", 5)]),
    ("Item {0} of {1}", "Item of", [("{0}", 5), ("{1}", 7)]),
    ("Hi {name}!", "Hi!", [("{name}", 2)]),
    ("Value {name!r:>10} set", "Value set", [("{name!r:>10}", 6)]),
    ("Path {user.home[0]} here", "Path here", [("{user.home[0]}", 5)]),
    ("Hello {{ user }}, bye", "Hello, bye", [("{{ user }}", 5)]),
    ("Cost ${price} now", "Cost now", [("${price}", 5)]),
    ("You have {count, plural, one {# item} other {# items}} left", "You have left",
     [("{count, plural, one {# item} other {# items}}", 9)]),
    ("{gender, select, male {He} female {She} other {They}} came", "came",
     [("{gender, select, male {He} female {She} other {They}}", 0)]),
    ("Paid {amount, number} today", "Paid today", [("{amount, number}", 5)]),
    ("See https://example.org/a_(b)?q=1. Then", "See. Then", [("https://example.org/a_(b)?q=1", 3)]),
    ("Visit www.example.com, then", "Visit, then", [("www.example.com", 5)]),
    ("Write to help.desk+mt@mail.example.co.uk.", "Write to.", [("help.desk+mt@mail.example.co.uk", 8)]),
    ("Size %dKB", "Size KB", [("%d", 5)]),
    ("(%s)", "()", [("%s", 1)]),
    ("%s %d %s", "", [("%s", 0), ("%d", 0), ("%s", 0)]),
]  # fmt: skip


@pytest.mark.parametrize(("source", "text", "placeholders"), STYLES, ids=[row[0] for row in STYLES])
def test_each_style_is_taken_out_to_an_empty_span_at_its_offset(source: str, text: str, placeholders: list) -> None:
    masked = mask_placeholders(Block(text=source))
    assert masked.text == text
    assert [(span.open.strip(), span.start) for span in masked.spans] == placeholders
    assert all(span.start == span.end and span.kind == SpanKind.PLACEHOLDER and not span.close for span in masked.spans)
    assert render(masked) == source


def test_a_block_without_placeholders_comes_back_as_it_is() -> None:
    block = Block(text="Ein Mann fährt Rad.", spans=(Span(start=4, end=8, open="<b>", close="</b>"),))
    assert mask_placeholders(block) is block


def test_the_blocks_spans_keep_their_words_and_a_placeholder_stays_inside_its_tag() -> None:
    # "<b>Delete %d</b> <i>old files</i> from %s"
    block = Block(
        text="Delete %d old files from %s",
        spans=(Span(start=0, end=9, open="<b>", close="</b>"), Span(start=10, end=19, open="<i>", close="</i>")),
    )
    masked = mask_placeholders(block)
    assert masked.text == "Delete old files from"
    bold, placeholder, italic, last = masked.spans
    assert masked.text[bold.start : bold.end] == "Delete" and (placeholder.start, placeholder.open) == (6, " %d")
    assert masked.text[italic.start : italic.end] == "old files" and (last.start, last.open) == (21, " %s")
    assert render(masked) == "<b>Delete %d</b> <i>old files</i> from %s"


def test_a_placeholder_across_a_tags_edge_stays_text() -> None:
    block = Block(text="see https://example.org now", spans=(Span(start=4, end=12, open="<a>", close="</a>"),))
    assert mask_placeholders(block) is block


@pytest.mark.parametrize(("text", "offset", "open", "written"), [
    ("Supprimer fichiers", 10, "%d ", "Supprimer %d fichiers"),  # placed at the next word's start
    ("Supprimer fichiers", 9, "%d ", "Supprimer %d fichiers"),  # placed at the word before's end
    ("Bonjour", 7, "%s ", "Bonjour %s"),  # at the end
    ("fichiers", 0, " %d", "%d fichiers"),  # at the start
    ("Bonjour, toi", 7, " %s", "Bonjour %s, toi"),  # before punctuation
    ("Taille (Ko)", 8, " %d", "Taille (%d Ko)"),  # after an opening bracket
    ("Taille Ko", 7, "%d", "Taille %dKo"),  # glued to its word in the source: as it was
])  # fmt: skip
def test_a_placeholder_that_stood_apart_stands_apart_wherever_it_is_placed(text, offset, open, written) -> None:
    block = Block(text=text, spans=(Span(start=offset, end=offset, open=open, kind=SpanKind.PLACEHOLDER),))
    assert render(space_placeholders(block)) == written


def render(block: Block) -> str:
    """The block's text with each span's markup written in (placeholders as their text)."""
    inserts = sorted(
        [(span.start, order, span.open) for order, span in enumerate(block.spans)]
        + [(span.end, -1 - order, span.close) for order, span in enumerate(block.spans)],
        key=lambda insert: (insert[0], insert[1] if insert[1] >= 0 else len(block.spans) - insert[1]),
    )
    pieces, position = [], 0
    for offset, _, markup in inserts:
        pieces += [block.text[position:offset], markup]
        position = offset
    return "".join([*pieces, block.text[position:]])


PLACEHOLDERS = [row[2][0][0] for row in STYLES if row[2]]
WORDS = st.sampled_from(["Ein", "Mann", "fährt", "Rad", "mit", "dem", "Hund", ",", ".", "(", ")"])
SOURCES = st.lists(st.one_of(WORDS, WORDS, st.sampled_from(PLACEHOLDERS)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(SOURCES)
def test_masking_takes_out_exactly_what_the_spans_put_back(pieces: list[str]) -> None:
    source = " ".join(pieces)
    masked = mask_placeholders(Block(text=source))
    assert render(masked) == source
    assert not find_placeholders(masked.text.replace("%%", ""))


def stub_translation(text: str) -> Translation:
    """The 'translation' of a reversing model: the words upper-cased in reverse order, each aligned to its source."""
    words = text.split()
    return Translation(
        text=" ".join(word.upper() for word in reversed(words)),
        score=0.0,
        tokens=[],
        alignment=[(index, len(words) - 1 - index) for index in range(len(words))],
    )


@settings(max_examples=200, deadline=None)
@given(SOURCES)
def test_each_placeholder_is_in_the_translation_as_often_as_in_the_source(pieces: list[str]) -> None:
    source = " ".join(pieces)
    masked = mask_placeholders(Block(text=source))
    output = render(space_placeholders(place_spans(masked, stub_translation(masked.text))))
    for placeholder in set(PLACEHOLDERS):
        assert output.count(placeholder) == source.count(placeholder), placeholder
