"""XML (`--format xml`): read by lxml without the network, a DTD or entity expansion, so a document costs what it weighs.

An element with text of its own (mixed content: `<para>Press <b>OK</b> now</para>`) is a block; the elements inside
it are spans, put back around the words their words align to. An element without text of its own only holds other
elements. Elements marked `translate="no"` (or ITS's `its:translate="no"`), comments, processing instructions and
entity references are left as they are (inside a block, as an empty span). The whitespace around a block's words is
kept, so `xml:space="preserve"` text keeps its margins. XML that is not well-formed is refused with lxml's message,
line and column.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from lxml import etree

from mtkit.documents.blocks import Block, Span, SpanKind
from mtkit.documents.formats import DocumentLimits, DocumentTooLarge, check_shape
from mtkit.documents.tags import clipped, span_tree
from mtkit.errors import MtkitError

ITS_TRANSLATE = "{http://www.w3.org/2005/11/its}translate"
DECLARATION = re.compile(r"\A<\?xml[^>]*\?>")
Element = etree._Element


@dataclass(frozen=True, kw_only=True)
class XmlDocument:
    """The parsed tree, and for each block the element it fills (by its position in the tree's `iter()` order)."""

    blocks: tuple[Block, ...]
    tree: etree._ElementTree
    places: tuple[int, ...]  # per block, the index of its element in iter() order
    margins: tuple[tuple[str, str], ...]  # per block, the whitespace before and after its words
    declaration: str  # the source's <?xml ...?>, written back as it was

    def render(self, translated: Sequence[Block]) -> str:
        tree = copy.deepcopy(self.tree)
        nodes = list(tree.getroot().iter())
        for place, block, (before, after) in zip(self.places, translated, self.margins, strict=True):
            _fill(nodes[place], block, margins=(before, after))
        body = etree.tostring(tree, encoding="unicode")
        return f"{self.declaration}\n{body}" if self.declaration else body


def read(text: str, *, name: str, limits: DocumentLimits) -> XmlDocument:
    """`text` parsed (well-formed, or one line with lxml's message, line and column); its blocks in reading order."""
    starts = text.count("<") - text.count("</") - text.count("<!") - text.count("<?")  # start tags, give or take
    check_shape(name=name, depth=0, tags=starts, limits=limits)  # before lxml builds a tree of them
    parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False, load_dtd=False, remove_comments=False)
    try:
        root = etree.fromstring(text.encode("utf-8"), parser)
    except etree.XMLSyntaxError as err:
        line, column = err.position
        message = " ".join(str(err.msg).split())[:160]  # lxml's words, without its "(<string>, line N)"
        if "Excessive depth" in message:  # libxml2's own bound, below huge_tree
            raise DocumentTooLarge(
                f"{name}:{line}:{column}: elements nested too deep ({message}); flatten the document"
            ) from None
        raise MtkitError(f"{name}:{line}:{column}: not well-formed XML ({message}); fix the markup there") from None
    order = {node: index for index, node in enumerate(root.iter())}
    blocks, places, margins = [], [], []
    for element in _block_elements(root, name=name, limits=limits):
        block, margin = _block(element)
        blocks.append(block)
        places.append(order[element])
        margins.append(margin)
    declaration = DECLARATION.match(text)
    return XmlDocument(
        blocks=tuple(blocks),
        tree=root.getroottree(),
        places=tuple(places),
        margins=tuple(margins),
        declaration=declaration.group() if declaration else "",
    )


def untouched(node: Element) -> bool:
    """A comment, processing instruction or entity reference, or an element marked translate="no"."""
    if not isinstance(node.tag, str):
        return True
    return "no" in ((node.get("translate") or "").strip().lower(), (node.get(ITS_TRANSLATE) or "").strip().lower())


def _block_elements(root: Element, *, name: str, limits: DocumentLimits) -> list[Element]:
    """The elements with text of their own, in document order, outside untouched ones (the tree's shape bounded)."""
    found, tags = [], 0
    stack = [(root, 1)]
    while stack:
        element, depth = stack.pop()
        tags += 1
        check_shape(name=name, depth=depth, tags=tags, limits=limits)
        if untouched(element):
            continue
        if _has_text(element):
            found.append(element)
            tags += sum(1 for _ in element.iter()) - 1
            check_shape(name=name, depth=depth, tags=tags, limits=limits)
            continue
        stack.extend((child, depth + 1) for child in reversed(element))
    return found


def _has_text(element: Element) -> bool:
    return bool((element.text or "").strip()) or any((child.tail or "").strip() for child in element)


def _block(element: Element) -> tuple[Block, tuple[str, str]]:
    """The element's content as text with a span per node inside it; the whitespace around its words apart."""
    content = _Content()
    content.add(element.text)
    for child in element:
        content.node(child)
        content.add(child.tail)
    text = "".join(content.parts)
    lead, end = len(text) - len(text.lstrip()), len(text.rstrip())
    inside = tuple(clipped(s, start=lead, end=end) for s in content.spans)
    return Block(text=text[lead:end], spans=inside), (text[:lead], text[end:])


class _Content:
    """A block's text and spans, read node by node."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.spans: list[Span] = []

    def add(self, text: str | None) -> None:
        self.parts.append(text or "")
        self.length += len(text or "")

    def node(self, node: Element, depth: int = 0) -> None:
        """A span for `node` over its content (empty, holding the node whole, when it is untouched)."""
        at, (open_tag, close_tag) = self.length, _key(node)
        index = len(self.spans)
        self.spans.append(Span(start=at, end=at, open=open_tag, close=close_tag, depth=depth))
        if untouched(node):
            return
        self.add(node.text)
        for child in node:
            self.node(child, depth + 1)
            self.add(child.tail)
        self.spans[index] = dataclasses.replace(self.spans[index], end=self.length)


def _key(node: Element) -> tuple[str, str]:
    """A node's markup as a span's: an element's start and end tags (`<x/>` alone when it is empty), an untouched
    node whole. Nodes with the same markup are interchangeable once their content is taken out."""
    if untouched(node):
        return etree.tostring(node, encoding="unicode", with_tail=False), ""
    shell = etree.tostring(etree.Element(node.tag, dict(node.attrib), nsmap=node.nsmap), encoding="unicode")
    if len(node) == 0 and not node.text:
        return shell, ""
    name = etree.QName(node).localname
    return shell[:-2] + ">", f"</{node.prefix}:{name}>" if node.prefix else f"</{name}>"


def _fill(element: Element, block: Block, *, margins: tuple[str, str]) -> None:
    """Put the translated block into `element`: its text, and each span's node (found by its markup among the
    element's) around the text the span covers."""
    pool: dict[tuple[str, str], list[Element]] = defaultdict(list)
    for node in _span_nodes(element):
        pool[_key(node)].append(node)
    tree = span_tree(block.spans)

    def build(parent: Element, index: int | None, start: int, end: int) -> None:
        written = start
        for child in tree[index]:
            span = block.spans[child]
            _append_text(parent, block.text[written : span.start])
            written = span.end
            if span.kind is SpanKind.PLACEHOLDER:  # text the model did not see, restored as it was
                _append_text(parent, span.open)
                continue
            node = pool[(span.open, span.close)].pop()
            node.tail = None
            parent.append(node)
            if span.close:  # an element around words: its content rebuilt
                _empty(node)
                build(node, child, span.start, span.end)
            else:  # an empty or untouched node: what the translation put after it follows it
                build(parent, child, span.start, span.end)
        _append_text(parent, block.text[written:end])

    _empty(element)
    _append_text(element, margins[0])
    build(element, None, 0, len(block.text))
    _append_text(element, margins[1])


def _span_nodes(element: Element) -> list[Element]:
    """The nodes inside `element` that are spans of its block (not those inside untouched ones)."""
    found = []
    for child in element:
        found.append(child)
        if not untouched(child):
            found.extend(_span_nodes(child))
    return found


def _empty(node: Element) -> None:
    node.text = None
    for child in list(node):
        node.remove(child)


def _append_text(parent: Element, text: str) -> None:
    if not text:
        return
    if len(parent):
        parent[-1].tail = (parent[-1].tail or "") + text
    else:
        parent.text = (parent.text or "") + text
