"""HTML read into blocks and written back: repaired as browsers repair it, every tag once, code and scripts untouched."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from selectolax.lexbor import LexborHTMLParser

from mtkit.decoding.translator import Translation
from mtkit.documents import html as html_format
from mtkit.documents.blocks import Block, Span, SpanKind
from mtkit.documents.formats import DocumentLimits, DocumentTooLarge
from mtkit.documents.html import VOID, first_node, read
from mtkit.documents.tags import place_spans, words

LIMITS = DocumentLimits()
MARKUP = re.compile(r"<!--.*?-->|<(/?)([a-z0-9]+)[^>]*>", re.DOTALL)


def reversed_words(block: Block) -> Block:
    """A stub translation: the block's words in reverse order, each aligned to its source word."""
    found = [block.text[start:end] for start, end in words(block.text)]
    pairs = [(source, len(found) - 1 - source) for source in range(len(found))]
    return place_spans(block, Translation(text=" ".join(reversed(found)), score=0.0, tokens=[], alignment=pairs))


def translated(source: str) -> str:
    document = read(source, name="page.html", limits=LIMITS)
    return document.render([reversed_words(block) for block in document.blocks])


def serialised(html: str) -> str:
    """What lexbor writes for `html` read as a fragment."""
    node, out = first_node(LexborHTMLParser(html, is_fragment=True)), []
    while node is not None:
        out.append(node.html or "")
        node = node.next
    return "".join(out)


def tags_of(html: str) -> list[str]:
    """The start tags written in `html`, after checking that every element it opens it closes, in order."""
    found, stack = [], []
    for match in MARKUP.finditer(html):
        closing, name = match.groups()
        if name and closing:
            assert stack.pop() == name
        elif name:
            found.append(match.group())
            stack.extend([] if name in VOID else [name])
    assert not stack
    return sorted(found)


def test_inline_tags_go_around_the_words_they_marked() -> None:
    assert translated('<p>one <b>two</b> <a href="x?a=1&amp;b=2">three</a></p>') == (
        '<p><a href="x?a=1&amp;b=2">three</a> <b>two</b> one</p>'
    )


def test_a_page_comes_back_as_read_when_nothing_changes() -> None:
    page = (
        '<!DOCTYPE html><html lang="de"><head><title>Titel &amp; mehr</title></head><body>'
        '<h1 class="x">Ein <em>Haus</em></h1><ul><li>eins</li><li>zwei<br>drei</li></ul>'
        "<table><tbody><tr><td>a</td><th>b</th></tr></tbody></table></body></html>"
    )
    document = read(page, name="page.html", limits=LIMITS)
    assert document.render(document.blocks) == page
    assert [block.text for block in document.blocks] == ["Titel & mehr", "Ein Haus", "eins", "zwei", "drei", "a", "b"]


def test_code_scripts_comments_and_translate_no_come_back_byte_for_byte() -> None:
    kept = [
        "<script>if (a < b && c > d) { x = '<p>'; }</script>",
        "<style>p > b { color: red; }</style>",
        "<pre>  a &lt; b\n    indented</pre>",
        "<code>ls -l &amp;&amp; cd</code>",
        "<!-- a comment <b> -->",
        '<span translate="no">Mtkit GmbH</span>',
        '<div class="notranslate"><p>keep me</p></div>',
    ]
    out = translated("<p>first words here</p>" + "".join(f"<p>Run {part} now please</p>" for part in kept))
    for part in kept:
        assert out.count(part) == 1


def test_entities_are_decoded_for_the_model_and_escaped_again() -> None:
    document = read("<p>Tom &amp; Jerry &lt;3 &copy;&nbsp;2024</p>", name="page.html", limits=LIMITS)
    assert document.blocks[0].text == "Tom & Jerry <3 ©\xa02024"
    assert document.render(document.blocks) == "<p>Tom &amp; Jerry &lt;3 ©&nbsp;2024</p>"


def test_placeholders_are_written_as_text() -> None:
    document = read("<p>a <b>b</b></p>", name="page.html", limits=LIMITS)
    [block] = document.blocks
    placeholder = Span(start=1, end=1, open="%s<&", kind=SpanKind.PLACEHOLDER)
    assert document.render([Block(text=block.text, spans=(placeholder, *block.spans))]) == "<p>a%s&lt;&amp; <b>b</b></p>"


def test_broken_html_is_repaired_as_a_browser_does() -> None:
    out = translated("<p>a <b>b <i>c</b> d</i><p>e f<li>g")
    assert out == serialised(out)  # read again, it is written the same
    assert out == "<p><i>d</i> <b><i>c</i> b</b> a</p><p>f e</p><li>g</li>"


def test_a_whole_page_gets_what_a_browser_adds() -> None:
    assert translated("<!DOCTYPE html><p>a b") == "<!DOCTYPE html><html><head></head><body><p>b a</p></body></html>"


@pytest.mark.parametrize(
    ("page", "limits", "said"),
    [
        ("<div>" * 20 + "x", DocumentLimits(max_depth=10), "page.html: elements nested more than 10 deep"),
        ("<p><b>x</b></p>" * 20, DocumentLimits(max_tags=15), "page.html: more than 15 tags"),
    ],
)
def test_documents_past_the_bounds_are_refused_in_one_line(page: str, limits: DocumentLimits, said: str) -> None:
    with pytest.raises(DocumentTooLarge) as caught:
        read(page, name="page.html", limits=limits)
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


def test_a_deep_page_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_parse(*_: object, **__: object) -> None:
        raise AssertionError("parsed")

    monkeypatch.setattr(html_format, "LexborHTMLParser", no_parse)
    for page in ("<div>" * 100_000 + "x", "<b><i>" * 200 + "x", "<p>" + "<span>" * 300):
        with pytest.raises(DocumentTooLarge, match="nested more than 256 deep"):
            read(page, name="page.html", limits=LIMITS)
    with pytest.raises(DocumentTooLarge, match="more than 15 tags"):
        read("<p>a</p>" * 8, name="page.html", limits=DocumentLimits(max_tags=15))


def test_unclosed_paragraphs_and_list_items_are_not_counted_deep() -> None:
    page = "<ul>" + "<li>a <p>b" * 400 + "</ul><table>" + "<tr><td>c<td>d" * 400 + "</table>"
    assert len(read(page, name="page.html", limits=LIMITS).blocks) == 1_600


PIECES = st.sampled_from(
    ["a", "b c", " ", "&amp;", "<", "é", "<b>", "</b>", "<i>", "</i>", '<a href="u">', "</a>", "<br>", "<p>", "</p>",
     "<li>", "<code>x</code>", "<!--c-->", "<span>", "</span>", "<div>", "</div>", "<img src=i>", "<td>", "<table>"]
)  # fmt: skip


def scrambled(block: Block, draw: random.Random) -> Block:
    """A stub translation whose alignment is drawn at random: any word to any word, some to none."""
    count = len(words(block.text))
    targets = draw.randint(0, count + 2)
    pairs = [(draw.randrange(count), draw.randrange(targets)) for _ in range(draw.randint(0, 2 * count))] if targets else []
    return place_spans(block, Translation(text=" ".join(["w"] * targets), score=0.0, tokens=[], alignment=pairs))


@settings(max_examples=150, deadline=None)
@given(st.lists(PIECES, max_size=25), st.randoms(use_true_random=False))
def test_any_markup_comes_back_well_formed_with_every_tag(pieces: list[str], draw: random.Random) -> None:
    source = "".join(pieces)
    document = read(source, name="page.html", limits=LIMITS)
    for out in (translated(source), document.render([scrambled(block, draw) for block in document.blocks])):
        assert tags_of(out) == tags_of(serialised(source))
