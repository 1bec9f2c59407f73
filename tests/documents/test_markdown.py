"""Markdown read into blocks and written back: what becomes a span, what is never touched, and that a translated
file parses to the same structure."""

from __future__ import annotations

import dataclasses

import pytest
from markdown_it import MarkdownIt

from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translation
from mtkit.documents import markdown
from mtkit.documents.blocks import Block, Span
from mtkit.documents.formats import DocumentLimits, DocumentTooLarge, format_named, read_document
from mtkit.documents.pipeline import translate_blocks
from mtkit.options import SplitBy

PAGE = """\
---
title: *not markdown*
---
# The *first* heading #

A paragraph with **strong words**, a [link](http://example.com/a_b?x=1 "Its title") and `inline *code*`
over two lines, a reference [link][docs], an image ![alt text](img.png) and <b>html</b>.\\
After a hard break &amp; an escaped \\* star.

> Quoted _emphasis_ here
> and ~~struck~~ words.

- first item with <http://auto.link>
- second item
  1. nested **one**

| Name | Value \\| pipe |
|------|-------|
| *a*  | b     |

Setext heading
==============

    indented code *stays*

```python
fenced = "*stays*"
```

<div>
an HTML *block*
</div>

[docs]: http://example.com/docs "Docs"
"""


def read(source: str, limits: DocumentLimits = DocumentLimits()) -> markdown.MarkdownDocument:
    return markdown.read(source, name="page.md", limits=limits)


def structure(source: str) -> list[tuple[str, str]]:
    """The Markdown's rendered tree, text aside: (token type, markup) of the blocks in order, each followed by its
    inline markup (type, markup, attributes) in any order (a translation may reorder it)."""
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    found = []
    for token in md.parse(source):
        found.append((token.type, token.markup))
        inline = [(c.type, f"{c.markup} {sorted((c.attrs or {}).items())}") for c in token.children or []]
        found += sorted(item for item in inline if item[0] not in ("text", "softbreak"))
    return found


def spans_of(block: Block) -> list[tuple[str, str, str]]:
    return [(block.text[span.start : span.end], span.open, span.close) for span in block.spans]


def test_untranslated_file_round_trips_byte_for_byte() -> None:
    document = read(PAGE)
    assert document.render(document.blocks) == PAGE
    crlf = PAGE.replace("\n", "\r\n")
    assert read(crlf).render(read(crlf).blocks) == crlf


def test_blocks_and_their_spans() -> None:
    blocks = read(PAGE).blocks
    texts = [block.text for block in blocks]
    assert texts[0] == "The first heading"
    assert spans_of(blocks[0]) == [("first", "*", "*")]
    paragraph = blocks[1]
    assert ("strong words", "**", "**") in spans_of(paragraph)
    assert ("link", "[", '](http://example.com/a_b?x=1 "Its title")') in spans_of(paragraph)
    assert ("link", "[", "][docs]") in spans_of(paragraph)
    opaque = [span.open for span in paragraph.spans if span.start == span.end]
    assert opaque == ["`inline *code*`", "![alt text](img.png)", "\\\n"]
    assert ("html", "<b>", "</b>") in spans_of(paragraph)
    assert "code" not in paragraph.text and "alt" not in paragraph.text
    assert "over two lines" in paragraph.text and "\n" not in paragraph.text
    assert "& an escaped * star." in paragraph.text
    assert spans_of(blocks[2]) == [("emphasis", "_", "_"), ("struck", "~~", "~~")]
    assert [span.open for span in blocks[3].spans] == ["<http://auto.link>"]
    assert texts[3:] == ["first item with ", "second item", "nested one", "Name", "Value | pipe", "a", "b", "Setext heading"]


def test_code_html_front_matter_and_definitions_are_not_blocks() -> None:
    texts = " ".join(block.text for block in read(PAGE).blocks)
    for untouched in ("stays", "block", "not markdown", "Docs", "docs]:"):
        assert untouched not in texts


def test_blocks_rewritten_keep_everything_else() -> None:
    document = read(PAGE)
    changed = [dataclasses.replace(block, text=block.text.upper()) for block in document.blocks]
    written = document.render(changed)
    assert structure(written) == structure(PAGE)
    for kept in ("title: *not markdown*", "    indented code *stays*", 'fenced = "*stays*"', "an HTML *block*", "[docs]: http"):
        assert kept in written
    again = read(written).blocks
    assert [block.text for block in again] == [block.text for block in changed]
    assert [[(s.start, s.end, s.open, s.close) for s in b.spans] for b in again] == [
        [(s.start, s.end, s.open, s.close) for s in b.spans] for b in changed
    ]


@pytest.mark.parametrize(
    "text",
    [
        "# not a heading",
        "- not a list",
        "1. not a list either",
        "> not a quote",
        "*stars* and _underscores_ and `ticks` and [brackets](x) and <b>tags</b>",
        "&amp; stays text, C# #tag, ~~no strike~~ and a back\\slash",
        "ends with hashes ##",
        "a | pipe!",
    ],
)
def test_any_translation_reads_back_as_the_same_text(text: str) -> None:
    """Whatever the model writes is escaped: it reads back as the same plain text in the same structure."""
    source = "# Title\n\n> - item\n\n| a |\n|---|\n| b |\n"
    document = read(source)
    written = document.render([Block(text=text) for _ in document.blocks])
    assert structure(written) == structure(source)
    assert [block.text for block in read(written).blocks] == [text.strip()] * len(document.blocks)


def test_placed_spans_are_written_around_words() -> None:
    """Spans as the pipeline returns them (outer spaces inside, emphasis in a word) still read back as markup."""
    document = read("Some **bold** and [a link](u) and `code`.\n")
    text = "und fett Link code ."
    placed = Block(
        text=text,
        spans=(
            Span(start=4, end=9, open="**", close="**"),  # "fett " with its space
            Span(start=9, end=13, open="[", close="](u)"),
            Span(start=19, end=19, open="`code`"),
        ),
    )
    written = document.render([placed])
    assert written == "und **fett** [Link](u) code `code`.\n"
    assert spans_of(read(written).blocks[0])[:2] == [("fett", "**", "**"), ("Link", "[", "](u)")]


def test_empty_emphasis_is_left_out() -> None:
    """`****` would read as literal stars or a thematic break: an emphasis with nothing inside writes nothing."""
    document = read("a **b** c\n")
    written = document.render([Block(text="x y", spans=(Span(start=1, end=1, open="**", close="**"),))])
    assert written == "x y\n"


class ReversingTranslator:
    """A stand-in for a model: each text's words in reverse order, word i aligned to word n-1-i."""

    directory = None  # no run, no word priors: the translation's alignment places tags

    def translate_nbest(self, texts: list[str], decoding: object = None, **_: object) -> list[list[Translation]]:
        found = []
        for text in texts:
            words = text.split()
            pairs = [(i, len(words) - 1 - i) for i in range(len(words))]
            found.append([Translation(text=" ".join(reversed(words)), score=0.0, tokens=[], alignment=pairs)])
        return found


def test_a_reversing_translation_places_emphasis_and_links_over_the_reversed_words() -> None:
    source = (
        "# Welcome to *the* project\n\n"
        'Read **the fine manual** before [you start](https://example.com/a_b "Start") here.\n\n'
        "- one `code` item\n\n"
        "```\nkept *as is*\n```\n"
    )
    document = read(source)
    translated = translate_blocks(ReversingTranslator(), document.blocks, decoding=Decoding(), split_by=SplitBy.LINES)
    written = document.render(translated)
    assert written.splitlines()[0] == "# project *the* to Welcome"
    assert written.splitlines()[2] == 'here. [start you](https://example.com/a_b "Start") before **manual fine the** Read'
    assert "```\nkept *as is*\n```\n" in written
    assert structure(written) == structure(source)


def test_emphasis_around_inline_code_alone_is_kept() -> None:
    """`**`qe`**` has no words of its own: its code span (empty, at the same place) is inside it, as tags nest."""
    document = read("**`qe`** prints the best\n")
    (block,) = document.blocks
    assert document.render([dataclasses.replace(block, text=block.text.upper())]) == "**`qe`** PRINTS THE BEST\n"


@pytest.mark.parametrize(
    "source",
    [
        "foo _snake_case_   \nbar\n",  # a hard break right after an emphasis: written after it, not inside
        "> \\\n[a](b) c\n",  # a hard break right before a link: written before it
        "x [a](b)   \n`x` y\n",
        "- | a   \n | -\n",  # a lazy line that would become a table row under the item's indentation
        "**`qe`** and `x` **b**\n",
    ],
)
def test_blocks_written_anew_read_back_the_same(source: str) -> None:
    """Each block written from its text and spans (not its source) parses to the same tree and text."""
    document = read(source)
    rewritten, done = [], 0
    for region, block in zip(document.regions, document.blocks, strict=True):
        rewritten += [source[done : region.start], markdown.render_block(block, region)]
        done = region.end
    written = "".join(rewritten) + source[done:]
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])

    def tree(text: str) -> list:
        markup = [(t.type, t.markup, [(c.type, c.markup) for c in t.children or [] if c.type != "text"]) for t in md.parse(text)]
        return markup

    assert tree(written) == tree(source)
    assert [block.text for block in read(written).blocks] == [block.text for block in document.blocks]


def test_a_hard_break_written_anew_keeps_the_files_line_ends_and_containers() -> None:
    document = read("> - one\\\r\n>   two\r\n")
    (block,) = document.blocks
    assert document.render([dataclasses.replace(block, text=block.text.upper())]) == "> - ONE\\\r\n>   TWO\r\n"


def test_a_url_in_the_text_is_kept_exactly_and_written_as_text() -> None:
    """The pipeline masks it (a placeholder span); written back escaped, it reads as the same URL, not as markup."""
    document = read("See https://example.com/\\*a\\* for **more** details.\n")
    translated = translate_blocks(ReversingTranslator(), document.blocks, decoding=Decoding(), split_by=SplitBy.LINES)
    written = document.render(translated)
    (block,) = read(written).blocks
    assert "https://example.com/*a*" in block.text and written.count("**") == 2


def test_the_format_row_reads_markdown_and_bounds_its_elements() -> None:
    document = read_document(format_named("markdown"), "# A *b*\n", name="page.md", limits=DocumentLimits())
    assert [block.text for block in document.blocks] == ["A b"]
    with pytest.raises(DocumentTooLarge, match=r"^page.md: more than 5 tags"):
        read("a *b* *c* `d` **e** [f](g) h\n", DocumentLimits(max_tags=5))


def test_inline_code_placed_against_a_word_is_set_apart_from_it() -> None:
    """The model never saw `ls`, so the translation has no gap for it: a space is written between it and a word."""
    document = read("Run `ls` now please, then ![logo](l.png)\n")
    translated = translate_blocks(ReversingTranslator(), document.blocks, decoding=Decoding(), split_by=SplitBy.LINES)
    assert document.render(translated) == "then ![logo](l.png) please, now Run `ls`\n"


def test_inline_code_written_against_a_word_in_the_source_stays_so() -> None:
    document = read("Two `Block`s and `x` here\n")
    (block,) = document.blocks
    assert document.render([dataclasses.replace(block, text=block.text.upper())]) == "TWO `Block`S AND `x` HERE\n"


def test_inline_html_elements_are_spans_and_stray_tags_opaque() -> None:
    """An element's start and end tags go around its words like emphasis; a tag without its pair stays whole."""
    (block,) = read('a <b>bold *x*<br></b> <i>y *<span class="k">z*</span>\n').blocks
    assert spans_of(block) == [
        ("bold x", "<b>", "</b>"),
        ("x", "*", "*"),
        ("", "<br>", ""),
        ("", "<i>", ""),
        ("z", "*", "*"),
        ("", '<span class="k">', ""),
        ("", "</span>", ""),
    ]


def test_an_element_around_spaces_alone_keeps_their_number() -> None:
    document = read("a <b> </b> b\n")
    (block,) = document.blocks
    assert document.render([dataclasses.replace(block, text=block.text.upper())]) == "A  <b></b> B\n"
