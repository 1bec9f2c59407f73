"""XLIFF 1.2 and 2.0 files (`--format xliff`): each untranslated unit's source translated into its target, marked as
a machine translation a person has to review.

translate-toolkit reads both versions (`translate.storage.xliff`, `translate.storage.xliff2`: its safe XML parser,
the units, 2.0's segments, `translate="no"`); the targets are written with lxml into the tree it read, and the tree is
written as it was parsed (translate-toolkit's own writer would re-indent the file). The state says what a target is:
1.2: `state="needs-review-translation"` with `state-qualifier="mt-suggestion"` (the standard's qualifier for a
machine translation). 2.0: `state="initial"` with `subState="mtkit:machine-translation"`: 2.0's `translated` means a
translator entered the target, and its states have no value for a machine's, so the segment stays `initial` (its
target a suggestion) and the subState, which 2.0 leaves to tools under a prefix, says where the target came from.

Inline codes become spans: a paired code with text inside (1.2 `<g>`, `<mrk>`; 2.0 `<pc>`, `<mrk>`) a tag around its
words, every other code (`<x/>`, `<bx/>`, `<ex/>`, `<ph>`, `<bpt>`, `<ept>`, `<it>`; 2.0 `<ph/>`, `<sc/>`, `<ec/>`) an
empty tag written back whole, each exactly once in the target.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from lxml import etree
from translate.storage import xliff, xliff2

from mtkit.documents.blocks import Block, Span, SpanKind
from mtkit.documents.formats import DocumentLimits, check_shape
from mtkit.documents.tags import markup
from mtkit.errors import MtkitError, one_line

XLIFF_1 = "urn:oasis:names:tc:xliff:document:1.2"
XLIFF_2 = "urn:oasis:names:tc:xliff:document:2.0"
XML_NAMESPACE = "http://www.w3.org/XML/1998/namespace"
PAIRED = {"g", "mrk", "pc"}  # inline codes around text the model translates
MACHINE_STATE = {  # where the state goes (the target, 2.0's segment) and what it says
    XLIFF_1: {"state": "needs-review-translation", "state-qualifier": "mt-suggestion"},
    XLIFF_2: {"state": "initial", "subState": "mtkit:machine-translation"},
}


@dataclass(frozen=True, kw_only=True)
class Unit:
    """A unit (1.2 `<trans-unit>`, 2.0 `<segment>`) to translate: its element, source and the block read from it."""

    element: etree._Element
    source: etree._Element
    block: Block


@dataclass(frozen=True, kw_only=True)
class XliffDocument:
    """An XLIFF file read by translate-toolkit; `blocks` are the sources of the units to translate, in file order."""

    tree: etree._ElementTree
    namespace: str  # XLIFF_1 or XLIFF_2
    units: tuple[Unit, ...]

    @property
    def blocks(self) -> list[Block]:
        return [unit.block for unit in self.units]

    def render(self, translated: Sequence[Block]) -> str:
        """The file with each unit's translation as its target, its state set; all else as read."""
        for unit, block in zip(self.units, translated, strict=True):
            target = _target(unit, self.namespace)
            parsed = _fragment(markup(block, escape=escape), self.namespace, unit.source)
            target.text = parsed.text
            target[:] = list(parsed)
            holder = target if self.namespace == XLIFF_1 else unit.element
            for key, value in MACHINE_STATE[self.namespace].items():
                holder.set(key, value)
        declaration = '<?xml version="1.0" encoding="UTF-8"?>\n'
        return declaration + etree.tostring(self.tree, encoding="unicode") + "\n"


def read(text: str, *, name: str, limits: DocumentLimits, retranslate: bool = False) -> XliffDocument:
    """The units of an XLIFF 1.2 or 2.0 file to translate: those without a target text (or every one with
    `retranslate`), `translate="no"` ones left out."""
    data = text.encode("utf-8")
    try:
        store = _store_class(data, name).parsestring(data)  # the root's start is read first: a wrong file stops there
    except etree.XMLSyntaxError as err:
        line, column = err.position
        raise MtkitError(f"{name}:{line}:{column}: not well-formed XML ({err.msg.split(' (line')[0]}); fix the file") from None
    except (ValueError, AssertionError, AttributeError) as err:  # translate-toolkit's ways of refusing a tree
        raise MtkitError(f"{name}: not an XLIFF file translate-toolkit reads ({one_line(err)}); check it") from None
    namespace = XLIFF_2 if isinstance(store, xliff2.Xliff2File) else XLIFF_1
    tags = 0
    units = []
    for unit in store.units:
        source = unit.source_dom
        if source is None or not unit.istranslatable() or (not retranslate and _has_target(unit)):
            continue
        block, count = _block(source, name=name, limits=limits)
        tags += count
        check_shape(name=name, depth=0, tags=tags, limits=limits)
        units.append(Unit(element=unit.xmlelement, source=source, block=block))
    return XliffDocument(tree=store.document, namespace=namespace, units=tuple(units))


def _store_class(data: bytes, name: str) -> type[xliff.xlifffile] | type[xliff2.Xliff2File]:
    """translate-toolkit's class for the file's version, read from its root element's namespace."""
    for _, element in etree.iterparse(io.BytesIO(data), events=("start",), resolve_entities=False, no_network=True):
        namespace = etree.QName(element).namespace
        if namespace in (XLIFF_1, XLIFF_2):
            return xliff2.Xliff2File if namespace == XLIFF_2 else xliff.xlifffile
        raise MtkitError(f"{name}: the root element is {element.tag}, not XLIFF 1.2's or 2.0's <xliff>; give an XLIFF file")
    raise MtkitError(f"{name}: an empty file; give an XLIFF file")


def _has_target(unit: xliff.xliffunit) -> bool:
    target = unit.get_target_dom()
    return target is not None and bool("".join(target.itertext()).strip())


def _block(source: etree._Element, *, name: str, limits: DocumentLimits) -> tuple[Block, int]:
    """The source's text and its inline codes as spans; the number of codes."""
    text: list[str] = [source.text or ""]
    spans: list[Span] = []

    def walk(element: etree._Element, depth: int) -> None:
        for child in element:
            check_shape(name=name, depth=depth, tags=len(spans), limits=limits)
            if not isinstance(child.tag, str):  # a comment or processing instruction: not text
                text.append(child.tail or "")
                continue
            start = sum(map(len, text))
            if etree.QName(child).localname in PAIRED:
                index = len(spans)
                spans.append(Span(start=start, end=start, open=_start_tag(child), close=_end_tag(child)))
                text.append(child.text or "")
                walk(child, depth + 1)
                spans[index] = Span(start=start, end=sum(map(len, text)), open=spans[index].open, close=spans[index].close)
            else:
                spans.append(Span(start=start, end=start, open=_element_markup(child), kind=SpanKind.TAG))
            text.append(child.tail or "")

    walk(source, 1)
    return Block(text="".join(text), spans=tuple(spans)), len(spans)


def _qualified(name: str, element: etree._Element) -> str:
    """An element's or attribute's name as written in the target, whose namespaces are the source's."""
    qname = etree.QName(name)
    if qname.namespace is None or qname.namespace in (XLIFF_1, XLIFF_2):
        return qname.localname
    if qname.namespace == XML_NAMESPACE:
        return f"xml:{qname.localname}"
    prefix = next((key for key, value in element.nsmap.items() if value == qname.namespace and key), None)
    return f"{prefix}:{qname.localname}" if prefix else qname.localname


def _start_tag(element: etree._Element, *, empty: bool = False) -> str:
    attributes = "".join(f" {_qualified(key, element)}={quoteattr(value)}" for key, value in element.attrib.items())
    return f"<{_qualified(element.tag, element)}{attributes}{'/' if empty else ''}>"


def _end_tag(element: etree._Element) -> str:
    return f"</{_qualified(element.tag, element)}>"


def _element_markup(element: etree._Element) -> str:
    """An inline code written whole (its native code, or a `<sub>` inside it), without its tail."""
    if element.text is None and len(element) == 0:
        return _start_tag(element, empty=True)
    inner = "".join(_element_markup(child) + escape(child.tail or "") for child in element if isinstance(child.tag, str))
    return f"{_start_tag(element)}{escape(element.text or '')}{inner}{_end_tag(element)}"


def _fragment(content: str, namespace: str, source: etree._Element) -> etree._Element:
    """`content` (a target's markup) parsed inside a target element that declares the source's namespaces."""
    declarations = "".join(
        f" xmlns:{prefix}={quoteattr(uri)}" for prefix, uri in source.nsmap.items() if prefix and uri != XML_NAMESPACE
    )
    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    return etree.fromstring(f'<target xmlns="{namespace}"{declarations}>{content}</target>', parser)


def _target(unit: Unit, namespace: str) -> etree._Element:
    """The unit's target element, made after its source when it has none (1.2: after a `<seg-source>` too)."""
    target = unit.element.find(f"{{{namespace}}}target")
    if target is not None:
        return target
    target = etree.Element(f"{{{namespace}}}target")
    anchor = unit.element.find(f"{{{namespace}}}seg-source")
    anchor = unit.source if anchor is None else anchor
    before = anchor.getprevious()
    indent = anchor.getparent().text if before is None else before.tail  # the anchor's own line's indentation
    anchor.addnext(target)
    target.tail = anchor.tail
    if indent is not None and not indent.strip():
        anchor.tail = indent
    return target
