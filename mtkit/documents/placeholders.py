"""Placeholders (printf, Python, brace and ICU styles, URLs, e-mail addresses) masked before translation.

A model changes what it reads: it translates `{name}`, spaces out `%(count)d` and rewrites a URL. So each
placeholder is taken out of the text into an empty `PLACEHOLDER` span whose `open` is its exact text, and
`tags.place_spans` puts it back after the target word aligned to the source word before it. The model reads
natural text: the whitespace beside a placeholder goes with it, into the span ("Delete %d files" is read as
"Delete files", the span "%d " before "files"), and `space_placeholders` sets it apart from the target's words
again ("Supprimer %d fichiers").
`%%` is an escaped percent sign, not a placeholder, and stays in the text.
An ICU message (`{count, plural, one {# item} other {# items}}`) is one placeholder, kept whole.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

from mtkit.documents.blocks import Block, Span, SpanKind

_URL = r"(?:(?:https?|ftp|file)://|www\.)[^\s<>\"]+|mailto:[^\s<>\"]+"
_EMAIL = r"[A-Za-z0-9][\w.+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+"
# the opening of an ICU argument with a type: its end is found by counting braces (its messages nest them)
_ICU = r"\{\s*[A-Za-z_]\w*\s*,\s*(?:plural|selectordinal|select|number|date|time|spellout|ordinal|duration)\b"
_DOUBLE_BRACE = r"\{\{[^{}]*\}\}"
# Python's str.format fields ({}, {0}, {name.attr[key]!r:>10}) and templates' ${name}
_BRACE = r"\$?\{(?:[A-Za-z_]\w*|\d+)?(?:\.[A-Za-z_]\w*|\[[^\]{}]*\])*(?:![rsa])?(?::[^{}]*)?\}"
_PRINTF_NAMED = r"%\([^()\s]+\)[-+#0]*(?:\d+|\*)?(?:\.\d+)?[diouxXeEfFgGcrsa]"
# C and Python printf (%s, %5.2f, %1$s, %lld, Objective-C's %@); no space flag, so "50% of" stays text
_PRINTF = r"%(?:[1-9]\d*\$)?[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn@]"
_QT = r"%[1-9]\d?(?!\d)"  # Qt's and Windows' numbered arguments: %1, %2
_ESCAPED_PERCENT = r"%%"
_PATTERN = re.compile(
    "|".join(
        f"(?P<{name}>{pattern})"
        for name, pattern in (
            ("url", _URL),
            ("email", _EMAIL),
            ("icu", _ICU),
            ("double_brace", _DOUBLE_BRACE),
            ("brace", _BRACE),
            ("printf_named", _PRINTF_NAMED),
            ("printf", _PRINTF),
            ("qt", _QT),
            ("escaped_percent", _ESCAPED_PERCENT),
        )
    )
)
_URL_TRAILER = ".,;:!?'\")]}"  # sentence punctuation after a URL is not part of it
_OPENING = "([{\"'«„“‘¿¡"  # a placeholder right after one of these needs no space
_CLOSING = ".,;:!?)]}\"'»“”’…"  # nor right before one of these


def find_placeholders(text: str) -> list[tuple[int, int]]:
    """The [start, end) character ranges of the placeholders in `text`, in order, none overlapping."""
    found = []
    position = 0
    while (match := _PATTERN.search(text, position)) is not None:
        start, end = match.span()
        kind = match.lastgroup
        if kind == "icu":
            end = _balanced_end(text, start)
        elif kind == "url":
            end = _url_end(text, start, end)
        if end > start and kind != "escaped_percent":
            found.append((start, end))
        position = max(end, start + 1)
    return found


def _balanced_end(text: str, start: int) -> int:
    """The end of the brace group opening at `start` (ICU quotes aside), or `start` when it never closes."""
    depth = 0
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return index + 1
    return start


def _url_end(text: str, start: int, end: int) -> int:
    """`end` without the punctuation that ends the sentence around the URL (a closing bracket it opened stays)."""
    while end > start and text[end - 1] in _URL_TRAILER:
        closing = text[end - 1]
        opening = {")": "(", "]": "[", "}": "{"}.get(closing)
        if opening is not None and text.count(opening, start, end) >= text.count(closing, start, end):
            break
        end -= 1
    return end


def mask_placeholders(block: Block) -> Block:
    """`block` with each placeholder taken out of its text into an empty placeholder span whose `open` is the exact
    text taken out: the placeholder and the whitespace that would leave a gap without it; the block's spans keep
    their text."""
    cuts = list(_cuts(block))
    if not cuts:
        return block
    pieces, position = [], 0
    for cut_start, cut_end, _ in cuts:
        pieces.append(block.text[position:cut_start])
        position = cut_end
    pieces.append(block.text[position:])
    moved = [
        Span(start=_shifted(span.start, cuts), end=_shifted(span.end, cuts), open=span.open, close=span.close, kind=span.kind)
        for span in block.spans
    ]
    masked = [
        Span(start=_shifted(cut_start, cuts), end=_shifted(cut_start, cuts), open=text, kind=SpanKind.PLACEHOLDER)
        for cut_start, _, text in cuts
    ]
    # a placeholder comes after the markup that starts at its offset, so it stays inside a tag around it
    spans = sorted([*moved, *masked], key=lambda span: (span.start, -span.end, span.kind == SpanKind.PLACEHOLDER))
    return Block(text="".join(pieces), spans=tuple(spans))


def space_placeholders(block: Block) -> Block:
    """A translated block with each placeholder that stood apart from its words in the source (its span's `open`
    holds the space taken out beside it) apart from the target's words too, wherever the span was placed: a space
    between it and a word on either side, none before closing or after opening punctuation, none doubled."""
    spans = []
    for span in block.spans:
        core = span.open.strip()
        if span.kind is SpanKind.PLACEHOLDER and core != span.open:
            before = block.text[span.start - 1] if span.start > 0 else " "
            after = block.text[span.start] if span.start < len(block.text) else " "
            spaced = (" " if not before.isspace() and before not in _OPENING else "") + core
            span = dataclasses.replace(span, open=spaced + (" " if not after.isspace() and after not in _CLOSING else ""))
        spans.append(span)
    return dataclasses.replace(block, spans=tuple(spans))


def _cuts(block: Block) -> Iterator[tuple[int, int, str]]:
    """(start, end, text) of each range to take out: a placeholder and the whitespace that reads as a gap without
    it (after it when a word follows, else before it), never across a span's edge. A placeholder across a span's
    edge stays text: taking it out would tear the markup."""
    text = block.text
    edges = {offset for span in block.spans for offset in (span.start, span.end)}
    previous_end = 0  # where the last cut ended: text before it is taken out already
    for start, end in find_placeholders(text):
        if any(start < edge < end for edge in edges):
            continue
        cut_start, cut_end = start, end
        before, after = start, end
        while before > previous_end and text[before - 1].isspace() and before not in edges:
            before -= 1
        while after < len(text) and text[after].isspace() and after not in edges:
            after += 1
        if end < after < len(text):
            cut_end = after  # a word follows: the space after goes, the span sits at the word's start
        elif before < start and (end == len(text) or not text[end].isalnum()):
            cut_start = before  # the end of the text or punctuation follows: the space before goes
        previous_end = cut_end
        yield cut_start, cut_end, text[cut_start:cut_end]


def _shifted(offset: int, cuts: list[tuple[int, int, str]]) -> int:
    """Where `offset` of the text lands once `cuts` are taken out."""
    return offset - sum(max(0, min(offset, cut_end) - cut_start) for cut_start, cut_end, _ in cuts)
