"""XML read into blocks and written back: well-formed or one line with its line and column, nothing fetched or
expanded, inline elements kept around their words, translate="no" untouched."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from mtkit.decoding.translator import Translation
from mtkit.documents.blocks import Block, Span, SpanKind
from mtkit.documents.formats import DocumentLimits, DocumentTooLarge
from mtkit.documents.tags import place_spans, words
from mtkit.documents.xml import read
from mtkit.errors import MtkitError

LIMITS = DocumentLimits()


def reversed_words(block: Block) -> Block:
    """A stub translation: the block's words in reverse order, each aligned to its source word."""
    found = [block.text[start:end] for start, end in words(block.text)]
    pairs = [(source, len(found) - 1 - source) for source in range(len(found))]
    return place_spans(block, Translation(text=" ".join(reversed(found)), score=0.0, tokens=[], alignment=pairs))


def translated(source: str) -> str:
    document = read(source, name="doc.xml", limits=LIMITS)
    return document.render([reversed_words(block) for block in document.blocks])


def test_inline_elements_go_around_the_words_they_marked() -> None:
    source = '<doc><para>one <b>two</b> <link href="x">three</link></para><list><item>four five</item></list></doc>'
    assert (
        translated(source)
        == '<doc><para><link href="x">three</link> <b>two</b> one</para><list><item>five four</item></list></doc>'
    )


def test_the_declaration_doctype_namespaces_and_comments_come_back() -> None:
    source = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE doc [<!ENTITY product "Mtkit">]>\n'
        '<doc xmlns:x="urn:x"><!-- note --><x:p>a &product; <x:em k="v">b</x:em></x:p></doc>'
    )
    document = read(source, name="doc.xml", limits=LIMITS)
    assert document.render(document.blocks) == source.replace(" [<", " [\n<").replace('">]>', '">\n]>')
    assert translated(source).endswith('<x:p><x:em k="v">b</x:em> a&product;</x:p></doc>')


def test_translate_no_and_its_translate_no_are_left_untouched() -> None:
    source = (
        '<doc xmlns:its="http://www.w3.org/2005/11/its"><p translate="no">keep these words</p>'
        '<p its:translate="no">and these</p><p>swap <code translate="no">x &lt; y</code> us</p></doc>'
    )
    out = translated(source)
    assert '<p translate="no">keep these words</p>' in out and '<p its:translate="no">and these</p>' in out
    assert '<code translate="no">x &lt; y</code>' in out


def test_placeholders_are_written_as_text() -> None:
    document = read("<doc><p>a <b>b</b></p></doc>", name="doc.xml", limits=LIMITS)
    [block] = document.blocks
    placeholder = Span(start=1, end=1, open="%s<&", kind=SpanKind.PLACEHOLDER)
    assert (
        document.render([Block(text=block.text, spans=(placeholder, *block.spans))]) == "<doc><p>a%s&lt;&amp; <b>b</b></p></doc>"
    )


def test_preserved_space_keeps_its_margins() -> None:
    assert (
        translated('<doc><pre xml:space="preserve">\n  a b\n</pre></doc>')
        == '<doc><pre xml:space="preserve">\n  b a\n</pre></doc>'
    )


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("<doc>\n  <p>a</doc>", "doc.xml:2:"),
        ("<doc><p>a &undefined; b</p></doc>", "doc.xml:1:"),
        ("<doc a='1' a='2'/>", "doc.xml:1:"),
    ],
)
def test_xml_that_is_not_well_formed_is_one_line_with_its_line_and_column(source: str, said: str) -> None:
    with pytest.raises(MtkitError) as caught:
        read(source, name="doc.xml", limits=LIMITS)
    message = str(caught.value)
    assert message.startswith(said) and "not well-formed XML" in message and "\n" not in message


def test_entities_are_neither_expanded_nor_fetched(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    laughs = '<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">'
    source = f'<!DOCTYPE doc [{laughs}<!ENTITY s SYSTEM "file://{secret}">]><doc><p>x &c; &s; y</p></doc>'
    out = translated(source)
    assert "SECRET" not in out and "aaaaaaaaaa" * 3 not in out and "&c;" in out and "&s;" in out


@pytest.mark.parametrize(
    ("source", "limits", "said"),
    [
        ("<d>" * 20 + "x" + "</d>" * 20, DocumentLimits(max_depth=10), "doc.xml: elements nested more than 10 deep"),
        ("<doc>" + "<p>a <b>x</b></p>" * 20 + "</doc>", DocumentLimits(max_tags=15), "doc.xml: more than 15 tags"),
        ("<d>" * 300 + "x" + "</d>" * 300, LIMITS, "doc.xml:1:"),
        ("<doc>" + "<x/>" * 20 + "</doc>", DocumentLimits(max_tags=15), "doc.xml: more than 15 tags"),
    ],
)
def test_documents_past_the_bounds_are_refused_in_one_line(source: str, limits: DocumentLimits, said: str) -> None:
    with pytest.raises(DocumentTooLarge) as caught:
        read(source, name="doc.xml", limits=limits)
    assert str(caught.value).startswith(said)


@st.composite
def documents(draw: st.DrawFn, depth: int = 0) -> str:
    parts = draw(st.lists(st.sampled_from(["w", "x y", " ", "&amp;", "&lt;", "é", "<br/>", "<!--c-->", "ELEMENT"]), max_size=6))
    out = []
    for part in parts:
        if part == "ELEMENT" and depth < 4:
            name = draw(st.sampled_from(["b", "i", "p", "x:q"]))
            attributes = draw(st.sampled_from(["", ' k="v"', ' translate="no"']))
            out.append(f"<{name}{attributes}>{draw(documents(depth + 1))}</{name}>")
        elif part != "ELEMENT":
            out.append(part)
    return "".join(out)


def scrambled(block: Block, draw: random.Random) -> Block:
    """A stub translation whose alignment is drawn at random: any word to any word, some to none."""
    count = len(words(block.text))
    targets = draw.randint(0, count + 2)
    pairs = [(draw.randrange(count), draw.randrange(targets)) for _ in range(draw.randint(0, 2 * count))] if targets else []
    return place_spans(block, Translation(text=" ".join(["w"] * targets), score=0.0, tokens=[], alignment=pairs))


def elements(xml: str) -> list[str]:
    return sorted(node.tag for node in etree.fromstring(xml).iter() if isinstance(node.tag, str))


@settings(max_examples=150, deadline=None)
@given(documents(), st.randoms(use_true_random=False))
def test_any_document_comes_back_well_formed_with_every_element(body: str, draw: random.Random) -> None:
    source = f'<doc xmlns:x="urn:x">{body}</doc>'
    document = read(source, name="doc.xml", limits=LIMITS)
    for out in (translated(source), document.render([scrambled(block, draw) for block in document.blocks])):
        assert elements(out) == elements(source)
