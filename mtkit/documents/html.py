"""HTML (`--format html`): read by lexbor's HTML5 parser (selectolax), so broken markup is repaired as browsers repair it.

Every run of text and inline elements (`<b>`, `<a href=...>`, `<img>`...) inside another element (`<p>`, `<li>`, `<td>`,
a `<div>` with text...) is a block; its inline elements are spans. Elements the model must not see (`<code>`, `<pre>`,
`<script>`, `<style>`, `translate="no"`...) and comments are written back as the parser read them: between blocks, or
inside one as an empty span whose markup is the element. Text is decoded for the model and escaped again on output;
the output is the parsed document serialised (attribute values quoted), with each block's translation in its place.
A whole document (one that starts with a doctype, `<html>`, `<head>` or `<body>`) comes back whole; anything else is
read as a fragment and comes back as one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from selectolax.lexbor import LexborHTMLParser, LexborNode

from mtkit.documents.blocks import Block, Span
from mtkit.documents.formats import DocumentLimits, check_shape
from mtkit.documents.tags import clipped, markup

# Phrasing elements that become spans inside a block; any other element holds blocks of its own, and a <br> ends one
# (the lines either side of it are read apart, as a reader sees them).
INLINE = frozenset(
    "a abbr acronym b bdi bdo big cite code data del dfn em font i img input ins kbd label mark q rp rt ruby s samp "
    "small span strike strong sub sup svg math time tt u var wbr".split()
)
# Elements written back untouched, their content unseen by the model.
UNTOUCHED = frozenset("code kbd samp var pre script style textarea svg math template noscript iframe object".split())
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
# Elements whose content is text up to their end tag, a start tag of the same name closing an open one (an upper
# bound: a parser closes them on more), and those whose start closes an open <p>.
RAW_TEXT = frozenset("script style textarea title xmp iframe noembed noframes noscript plaintext".split())
SIBLINGS = frozenset("p li dt dd option optgroup tr td th thead tbody tfoot rb rt rp rtc".split())
CLOSES_P = frozenset(
    "address article aside blockquote details div dl fieldset figcaption figure footer form h1 h2 h3 h4 h5 h6 header "
    "hgroup hr main menu nav ol p pre section table ul li dd dt".split()
)
TAG_TOKEN = re.compile(r"<!--.*?(?:-->|\Z)|<(/?)([a-zA-Z][^\s/>]*)[^>]*>", re.DOTALL)
WHOLE_DOCUMENT = re.compile(r"\A\s*(?:<!--.*?-->\s*)*<(?:!doctype|html|head|body)[\s>]", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class HtmlDocument:
    """The serialised document: literal markup, with the index of a block where its translation goes."""

    blocks: tuple[Block, ...]
    parts: tuple[str | int, ...]

    def render(self, translated: Sequence[Block]) -> str:
        return "".join(part if isinstance(part, str) else markup(translated[part], escape=escape_text) for part in self.parts)


def read(text: str, *, name: str, limits: DocumentLimits) -> HtmlDocument:
    """`text` parsed as a whole document or a fragment; its blocks in reading order."""
    check_nesting(text, name=name, limits=limits)
    reader = _Reader(name=name, limits=limits)
    if WHOLE_DOCUMENT.match(text):
        document = LexborHTMLParser(text)
        reader.children(document.root.parent.child if document.root else None, depth=0)
    else:
        reader.children(first_node(LexborHTMLParser(text, is_fragment=True)), depth=0)
    reader.flush()
    return HtmlDocument(blocks=tuple(reader.blocks), parts=tuple(reader.parts))


def check_nesting(text: str, *, name: str, limits: DocumentLimits) -> None:
    """Refuse a document too deep or of too many tags before it is parsed: an HTML5 parser's time grows with depth
    times tags (lexbor's, with the square of the depth). The depth is estimated from the tags as a parser nests
    them, closing fewer elements than it does; the parsed tree is checked again as it is read."""
    lowered, stack, tags, position = text.lower(), [], 0, 0
    while match := TAG_TOKEN.search(lowered, position):
        position, closing, tag = match.end(), match.group(1), match.group(2)
        if tag is None:  # a comment
            continue
        tags += 1
        if tag in stack and (closing or tag in SIBLINGS):
            del stack[len(stack) - 1 - stack[::-1].index(tag) :]
        if closing or tag in VOID:
            check_shape(name=name, depth=len(stack), tags=tags, limits=limits)
            continue
        if tag in RAW_TEXT:
            end = lowered.find(f"</{tag}", position)
            position = len(lowered) if end < 0 else end
        if tag in CLOSES_P and stack and stack[-1] == "p":
            stack.pop()
        stack.append(tag)
        check_shape(name=name, depth=len(stack), tags=tags, limits=limits)


def first_node(fragment: LexborHTMLParser) -> LexborNode | None:
    """The fragment's first node as a plain node: selectolax's `root` stands for the whole fragment (its `html` and
    `text_content` cover all of it), its sibling's `prev` for the node alone."""
    root = fragment.root
    return root.next.prev if root is not None and root.next is not None else root


def escape_text(text: str) -> str:
    """Text as HTML writes it (what lexbor's serialiser escapes)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\xa0", "&nbsp;")


def start_tag(node: LexborNode) -> str:
    """An element's start tag as lexbor writes it: attribute values quoted and escaped, their order kept."""
    attributes = "".join(
        f' {key}="{(value or "").replace("&", "&amp;").replace(chr(34), "&quot;").replace(chr(160), "&nbsp;")}"'
        for key, value in node.attributes.items()
    )
    return f"<{node.tag}{attributes}>"


def untouched(node: LexborNode) -> bool:
    """An element written back as read: code, scripts, styles, preformatted text, or marked translate="no"."""
    attributes = node.attributes
    return (
        node.tag in UNTOUCHED
        or (attributes.get("translate") or "").strip().lower() == "no"
        or "notranslate" in (attributes.get("class") or "").split()
    )


@dataclass(kw_only=True)
class _Reader:
    """Walks the parsed tree once: markup between blocks into `parts`, each run of inline content into a block."""

    name: str
    limits: DocumentLimits
    blocks: list[Block] = field(default_factory=list)
    parts: list[str | int] = field(default_factory=list)
    tags: int = 0
    run: list[str] = field(default_factory=list)  # the current run's text, decoded
    length: int = 0  # its characters
    open_spans: int = 0  # the inline elements the walk is inside
    spans: list[Span] = field(default_factory=list)  # and its spans
    phrasing_of: dict[int, bool] = field(default_factory=dict)

    def children(self, node: LexborNode | None, *, depth: int) -> None:
        while node is not None:
            if self.phrasing(node):
                self.inline(node, depth=depth)
            else:
                self.flush()
                self.element(node, depth=depth)
            node = node.next

    def element(self, node: LexborNode, *, depth: int) -> None:
        """A node that is no part of a block: written as read when untouched, else its children read in turn."""
        self.count(depth)
        if node.tag.startswith("-") or untouched(node):  # a comment, the doctype
            self.parts.append(node.html or "")
            return
        self.parts.append(start_tag(node))
        self.children(node.child, depth=depth + 1)
        self.flush()
        if node.tag not in VOID:
            self.parts.append(f"</{node.tag}>")

    def inline(self, node: LexborNode, *, depth: int) -> None:
        """Text into the run's text, an inline element into a span around its content (empty when opaque)."""
        at = self.length
        if node.tag == "-text":
            self.run.append(node.text_content or "")
            self.length += len(self.run[-1])
            return
        self.count(depth)
        if node.tag == "-comment" or untouched(node) or node.tag in VOID:
            opaque = start_tag(node) if node.tag in VOID else node.html or ""
            self.spans.append(Span(start=at, end=at, open=opaque, depth=self.open_spans))
            return
        index = len(self.spans)
        self.spans.append(Span(start=at, end=at, open=""))
        self.open_spans += 1
        self.children(node.child, depth=depth + 1)
        self.open_spans -= 1
        self.spans[index] = Span(start=at, end=self.length, open=start_tag(node), close=f"</{node.tag}>", depth=self.open_spans)

    def flush(self) -> None:
        """The run read so far: a block when it has words, else its markup as it is."""
        text, spans = "".join(self.run), self.spans  # markup in the whitespace around the words stays outside the block
        self.run, self.spans, self.length = [], [], 0
        if not text.strip():
            self.parts.append(markup(Block(text=text, spans=tuple(spans)), escape=escape_text))
            return
        lead, end = len(text) - len(text.lstrip()), len(text.rstrip())
        where = [0 if s.start < lead and s.end <= lead else 2 if s.start > end or s.start == end < s.end else 1 for s in spans]
        before, inside, after = ([s for s, w in zip(spans, where, strict=True) if w == part] for part in range(3))
        self.parts.append(markup(Block(text=text[:lead], spans=tuple(before)), escape=escape_text))
        self.parts.append(len(self.blocks))
        self.blocks.append(Block(text=text[lead:end], spans=tuple(clipped(s, start=lead, end=end) for s in inside)))
        self.parts.append(
            markup(Block(text=text[end:], spans=tuple(clipped(s, start=end, end=len(text)) for s in after)), escape=escape_text)
        )

    def phrasing(self, node: LexborNode) -> bool:
        """Text, a comment, or an inline element holding only such (a link around a `<div>` holds blocks)."""
        if node.tag in ("-text", "-comment"):
            return True
        if node.tag not in INLINE:
            return False
        if node.mem_id not in self.phrasing_of:
            child, phrasing = node.child, True
            while phrasing and child is not None and not untouched(node):
                phrasing, child = self.phrasing(child), child.next
            self.phrasing_of[node.mem_id] = phrasing
        return self.phrasing_of[node.mem_id]

    def count(self, depth: int) -> None:
        self.tags += 1
        check_shape(name=self.name, depth=depth, tags=self.tags, limits=self.limits)
