"""Markdown read into blocks and written back (`--format markdown`), parsed by markdown-it-py.

CommonMark with GitHub's tables and strikethrough. Each paragraph, heading and table cell (in lists and block
quotes too) is a block; its emphasis, strong emphasis, strikethrough, links and inline HTML elements become spans,
so the pipeline puts them back around the translated words. Inline code, images, autolinks, lone HTML tags and hard
breaks are kept whole as empty spans (the model never sees them, and they come back exactly as written). Code
blocks, fenced code, HTML blocks, front matter, link reference definitions and everything between blocks are never
touched: a translated block replaces only its own source characters, and a block handed back unchanged writes its
source as it was, so an untranslated file comes back byte for byte.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline
from markdown_it.token import Token

from mtkit.documents.blocks import Block, Span, SpanKind
from mtkit.documents.formats import DocumentLimits, check_shape

# Inline rules whose whole source is one opaque unit, and the token that carries it.
OPAQUE_RULES = {"backticks": "code_inline", "image": "image", "autolink": "link_open", "html_inline": "html_inline"}
OPAQUE_TOKENS = {"code_inline", "image", "html_inline", "hardbreak"}
HARD_BREAK = "\\\n"
HTML_START = re.compile(r"<([A-Za-z][A-Za-z0-9-]*)(?:\s[^<>]*)?(?<!/)>")  # an element's start tag (not `<br/>`)
HTML_END = re.compile(r"</([A-Za-z][A-Za-z0-9-]*)\s*>")
INLINE_SPECIALS = re.compile(r"[\\`*_\[\]<~]|&(?=#?\w+;)|(?:(?<=\s)|^)#|!$")
LINE_START = re.compile(r"(?:^|(?<=\\\n))([ \t]*)(?:([>+\-=#|])|(\d{1,9})([.)]))")


@dataclass(frozen=True, kw_only=True)
class Region:
    """Where a block's inline source lies in the file, and how a line inside it continues."""

    start: int  # character offsets into the file
    end: int
    line_break: str  # a new line inside the block (after a hard break): the file's line end and the block's containers
    table_cell: bool = False  # `|` written escaped
    glued: frozenset[str] = frozenset()  # word-like units the source wrote against a word (`Block`s): kept so


@dataclass(frozen=True, kw_only=True)
class MarkdownDocument:
    """A Markdown file's source, its blocks, and where each block came from."""

    source: str
    blocks: tuple[Block, ...]
    regions: tuple[Region, ...]

    def render(self, blocks: Sequence[Block]) -> str:
        """The file with each block's source replaced by `blocks`' Markdown (a block unchanged keeps its source)."""
        if len(blocks) != len(self.blocks):
            raise ValueError(f"{len(blocks)} blocks given for a document of {len(self.blocks)}")
        parts, done = [], 0
        for region, old, new in zip(self.regions, self.blocks, blocks, strict=True):
            parts.append(self.source[done : region.start])
            parts.append(self.source[region.start : region.end] if new == old else render_block(new, region))
            done = region.end
        parts.append(self.source[done:])
        return "".join(parts)


def read(source: str, *, name: str, limits: DocumentLimits) -> MarkdownDocument:
    """The blocks of `source` (the file `name`) with their inline markup as spans (blocks without words left out).

    markdown-it-py nests at most 20 deep (deeper markup stays text); the elements counted are bounded by `limits`.
    """
    lines = SourceLines(source)
    tokens = parser().parse(lines.parsed())
    blocks, regions = [], []
    elements = 0
    for number, token in enumerate(tokens):
        elements += token.nesting == 1
        if token.type != "inline" or token.map is None:
            continue
        children = token.children or []
        elements += sum(child.nesting == 1 or child.type in OPAQUE_TOKENS for child in children)
        depth = token.level + max((child.level for child in children), default=0)
        check_shape(name=name, depth=depth, tags=elements, limits=limits)
        block = inline_block(children)
        if not block.text.strip():
            continue
        region = lines.region(token, opener=tokens[number - 1])
        if region is not None:
            blocks.append(block)
            regions.append(dataclasses.replace(region, glued=glued_units(block)))
    return MarkdownDocument(source=source, blocks=tuple(blocks), regions=tuple(regions))


@functools.cache
def parser() -> MarkdownIt:
    """CommonMark + tables + strikethrough, its opaque inline rules recording their source on their token."""
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    for rule in md.inline.ruler.__rules__:
        if rule.name in OPAQUE_RULES:
            md.inline.ruler.at(rule.name, keep_source(rule.fn, OPAQUE_RULES[rule.name]), {"alt": rule.alt})
        elif rule.name == "link":
            md.inline.ruler.at(rule.name, keep_link_close(rule.fn), {"alt": rule.alt})
    return md


def first_pushed(state: StateInline, since: int, *, kind: str) -> Token:
    """The first token of `kind` a rule pushed (a rule may push the pending text before its own)."""
    return next(token for token in state.tokens[since:] if token.type == kind)


def keep_source(rule: Callable[[StateInline, bool], bool], kind: str) -> Callable[[StateInline, bool], bool]:
    """`rule`, setting meta["source"] of the token it makes to the characters it consumed."""

    def wrapped(state: StateInline, silent: bool) -> bool:
        start, count = state.pos, len(state.tokens)
        if not rule(state, silent):
            return False
        if not silent:
            first_pushed(state, count, kind=kind).meta["source"] = state.src[start : state.pos]
        return True

    return wrapped


def keep_link_close(rule: Callable[[StateInline, bool], bool]) -> Callable[[StateInline, bool], bool]:
    """The link rule, setting meta["close"] of its link_open to the source after the text (`](url "title")`, `][ref]`)."""

    def wrapped(state: StateInline, silent: bool) -> bool:
        start, count = state.pos, len(state.tokens)
        if silent or state.src[start] != "[":
            return rule(state, silent)
        label_end = state.md.helpers.parseLinkLabel(state, start, True)
        if not rule(state, silent):
            return False
        first_pushed(state, count, kind="link_open").meta["close"] = state.src[label_end : state.pos]
        return True

    return wrapped


def inline_block(children: Sequence[Token]) -> Block:
    """An inline token's children as plain text with spans: paired markup (an inline HTML element's start and end tags
    too) around text, opaque units empty."""
    spans = InlineSpans()
    inside_autolink = False
    for token in children:
        if inside_autolink:
            inside_autolink = token.type != "link_close"
            continue
        raw = opaque_source(token)
        if token.type == "html_inline" and (start_tag := HTML_START.fullmatch(raw or "")) is not None:
            spans.open(raw or "", "", html=start_tag.group(1).lower())
        elif token.type == "html_inline" and (end_tag := HTML_END.fullmatch(raw or "")) and spans.close_html(end_tag):
            continue
        elif raw is not None:
            spans.unit(raw)
            inside_autolink = token.type == "link_open"
        elif token.nesting == 1:
            spans.open(opening_markup(token), closing_markup(token))
        elif token.nesting == -1:
            spans.close()
        else:
            spans.add_text(" " if token.type == "softbreak" else token.content)
    return spans.block()


class InlineSpans:
    """A block built from an inline token's children: its text, and its spans in the order their markup is written."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.size = 0
        self.spans: list[tuple[int, Span]] = []  # (the order it was written, span)
        self.opened: list[tuple[int, int, str, str, str]] = []  # (order, start, open, close, HTML element or "")

    def add_text(self, piece: str) -> None:
        self.text.append(piece)
        self.size += len(piece)

    def unit(self, raw: str, *, order: int | None = None, at: int | None = None) -> None:
        """An opaque unit: an empty span written as it is."""
        position = self.size if at is None else at
        written = len(self.spans) + len(self.opened) if order is None else order
        self.spans.append((written, Span(start=position, end=position, open=raw)))

    def open(self, markup: str, close: str, *, html: str = "") -> None:
        self.opened.append((len(self.spans) + len(self.opened), self.size, markup, close, html))

    def close(self) -> None:
        """The innermost Markdown markup closed; HTML start tags left open inside it become opaque units."""
        while self.opened and self.opened[-1][4]:
            self.unclosed()
        if self.opened:
            order, start, markup, close, _ = self.opened.pop()
            self.spans.append((order, Span(start=start, end=self.size, open=markup, close=close)))

    def close_html(self, end_tag: re.Match[str]) -> bool:
        """An HTML end tag closing the innermost start tag of its element, if no Markdown markup opened after it (start
        tags of other elements in between, never closed, become opaque units)."""
        element, depth = end_tag.group(1).lower(), len(self.opened)
        while depth and self.opened[depth - 1][4] not in ("", element):
            depth -= 1
        if not depth or self.opened[depth - 1][4] != element:
            return False
        while len(self.opened) > depth:
            self.unclosed()
        order, start, markup, _, _ = self.opened.pop()
        self.spans.append((order, Span(start=start, end=self.size, open=markup, close=end_tag.group())))
        return True

    def unclosed(self) -> None:
        order, start, markup, _, _ = self.opened.pop()
        self.unit(markup, order=order, at=start)

    def block(self) -> Block:
        while self.opened:
            self.unclosed()
        ordered = sorted(self.spans, key=lambda item: item[0])  # in the order written: a span after those containing it
        return Block(text="".join(self.text), spans=tuple(span for _, span in ordered))


def opaque_source(token: Token) -> str | None:
    """The exact Markdown of an inline unit kept whole (code, image, autolink, inline HTML, hard break), else None."""
    if token.type == "hardbreak":
        return HARD_BREAK
    if "source" in (token.meta or {}):
        return token.meta["source"]
    return None


def opening_markup(token: Token) -> str:
    return "[" if token.type == "link_open" else token.markup


def closing_markup(token: Token) -> str:
    if token.type == "link_open":
        return token.meta.get("close", "]")
    return token.markup


class SourceLines:
    """The file's lines with their offsets and line ends kept, and the block regions found in them."""

    def __init__(self, source: str) -> None:
        pieces = re.split(r"(\r\n|\r|\n)", source)
        self.row_cursor: dict[int, int] = {}  # a table row's line: where its next cell's search starts
        self.texts = [text.replace("\0", "\ufffd") for text in pieces[0::2]]  # as markdown-it reads them
        self.line_ends = pieces[1::2]
        self.starts, offset = [], 0
        for number, text in enumerate(self.texts):
            self.starts.append(offset)
            offset += len(text) + (len(pieces[2 * number + 1]) if 2 * number + 1 < len(pieces) else 0)

    def parsed(self) -> str:
        """The text markdown-it reads: front matter (a first line `---` up to the next `---` or `...`) blanked."""
        texts = list(self.texts)
        if texts and texts[0] == "---":
            end = next((n for n in range(1, len(texts)) if texts[n] in ("---", "...")), None)
            if end is not None:
                texts[: end + 1] = [""] * (end + 1)
        return "\n".join(texts)

    def region(self, inline: Token, *, opener: Token) -> Region | None:
        """Where `inline`'s content lies in the file (None where it cannot be found: the block is left alone)."""
        assert inline.map is not None
        first_line, content_lines = inline.map[0], inline.content.split("\n")
        if opener.type in ("th_open", "td_open"):
            return self.cell_region(first_line, inline.content)
        line = self.texts[first_line]
        last = self.texts[first_line + len(content_lines) - 1]
        if opener.type == "heading_open" and opener.markup.startswith("#"):
            start = line.find(content_lines[0], line.index("#") + len(opener.markup))
        else:
            start = len(line.rstrip()) - len(content_lines[0].strip())
        end = len(last.rstrip()) if len(content_lines) > 1 else start + len(content_lines[0])
        found = line[start:].startswith(content_lines[0].strip()) and last[:end].endswith(content_lines[-1].strip())
        if start < 0 or not found:
            return None
        line_end = self.line_ends[first_line] if first_line < len(self.line_ends) else "\n"
        containers = "".join(char if char in "> \t" else " " for char in line[:start])  # list markers as spaces
        return Region(
            start=self.starts[first_line] + start,
            end=self.starts[first_line + len(content_lines) - 1] + end,
            line_break=line_end + containers,
        )

    def cell_region(self, number: int, content: str) -> Region | None:
        """A table cell's content in its row, searched after the row's cells found before it."""
        line, written = self.texts[number], content.replace("|", "\\|")
        start = line.find(written, self.row_cursor.get(number, 0))
        if start < 0:
            return None
        self.row_cursor[number] = start + len(written)
        return Region(
            start=self.starts[number] + start, end=self.starts[number] + start + len(written), line_break="\n", table_cell=True
        )


def render_block(block: Block, region: Region) -> str:
    """`block` as Markdown inline source for `region`: on one line but for hard breaks, safe at a line's start."""
    block = set_apart(block, glued=region.glued)
    written = render_spans(block.text, nest(block.spans), start=0, end=len(block.text)).strip(" \t")
    written = LINE_START.sub(escape_line_start, written)
    if region.table_cell:
        written = written.replace("|", "\\|")
    return written.replace("\n", region.line_break)


def word_like(span: Span) -> bool:
    """Inline code, an image or an autolink: a unit read as a word, unlike inline HTML or a hard break."""
    opaque = span.start == span.end and not span.close and span.kind is SpanKind.TAG
    return opaque and (span.open.startswith(("`", "![")) or (span.open.startswith("<") and any(c in span.open for c in ":@")))


def against_word(text: str, position: int) -> tuple[bool, bool]:
    """Whether a letter or digit is right before and right after `position` of `text`."""
    return position > 0 and text[position - 1].isalnum(), position < len(text) and text[position].isalnum()


def glued_units(block: Block) -> frozenset[str]:
    """The word-like units of a block read from the source that stand against a word (`Block`s, `v`2)."""
    return frozenset(span.open for span in block.spans if word_like(span) and any(against_word(block.text, span.start)))


def set_apart(block: Block, *, glued: frozenset[str]) -> Block:
    """Each word-like unit placed against a word set apart from it by a space, unless the source had it so: the model
    never saw it, so the translation has no gap for it (`a `x` b`, not `a`x`b`)."""
    spans = []
    for span in block.spans:
        if word_like(span) and span.open not in glued:
            before, after = against_word(block.text, span.start)
            span = dataclasses.replace(span, open=" " * before + span.open + " " * after)
        spans.append(span)
    return dataclasses.replace(block, spans=tuple(spans))


@dataclass(frozen=True)
class Node:
    span: Span
    children: list[Node]


def contains(outer: Span, inner: Span) -> bool:
    """Whether `inner` goes inside `outer`: its characters lie within, ties included (as `tags.place_spans` nests)."""
    return outer.start <= inner.start and inner.end <= outer.end


def nest(spans: Sequence[Span]) -> list[Node]:
    """The spans (in the order written) as a forest: each node's children lie within it."""
    roots: list[Node] = []
    stack: list[Node] = []
    for span in spans:
        while stack and not contains(stack[-1].span, span):
            stack.pop()
        node = Node(span, [])
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    return roots


def render_spans(text: str, nodes: Sequence[Node], *, start: int, end: int) -> str:
    """text[start:end] escaped, with each node's markup around its own part."""
    out, done = [], start
    for node in nodes:
        out.append(escape(text[done : node.span.start]))
        out.append(render_node(text, node))
        done = max(done, node.span.end)
    out.append(escape(text[done:end]))
    return "".join(out)


def render_node(text: str, node: Node) -> str:
    """A span's markup around its content, with the content's outer spaces moved outside (`**a** b`, not `**a **b`)
    and the empty spans at its very end written after it (`**a**`code``: a tie is read as inside, written after)."""
    span, children = node.span, list(node.children)
    after: list[Node] = []
    while span.start < span.end and children and children[-1].span.start == children[-1].span.end == span.end:
        after.insert(0, children.pop())
    inner = render_spans(text, children, start=span.start, end=span.end)
    following = "".join(render_node(text, child) for child in after)
    if span.kind is SpanKind.PLACEHOLDER:  # text the model must not change (a URL, `%s`): written as text
        return escape(span.open) + inner + following
    if not span.close:
        return span.open + inner + following
    body = inner.strip(" \t")
    if not body and span.open in ("*", "_", "**", "__", "~~", "~"):
        return inner + following  # empty emphasis would be read as literal asterisks (or a rule): nothing to emphasise
    lead = inner[: len(inner) - len(inner.lstrip(" \t"))]
    trail = inner[len(lead) + len(body) :]
    return f"{lead}{span.open}{body}{span.close}{trail}{following}"


def escape(text: str) -> str:
    """Plain text as Markdown that reads back as the same text (no markup, entity or block marker appears)."""
    return INLINE_SPECIALS.sub(lambda match: "\\" + match.group(), text.replace("\n", " "))


def escape_line_start(match: re.Match[str]) -> str:
    """A block marker at a line's start (`#`, `>`, `-`, `1.`) escaped, so the line stays a paragraph's."""
    spaces, marker, number, dot = match.groups()
    return f"{spaces}\\{marker}" if marker else f"{spaces}{number}\\{dot}"
