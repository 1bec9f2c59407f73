"""What a format hands to the pipeline and gets back: a block of plain text with its inline markup.

A `Span` is markup around characters [start, end) of the block's text: an inline tag (`<b>`...`</b>`, Markdown's
`**`...`**`, `<a href="...">`...`</a>`), an empty element (start == end: `<br/>`, XLIFF's `<x/>`), or a masked
placeholder (`%s`, `{count}`, a URL), whose `open` is restored exactly. Spans nest properly: a span that starts
inside another ends inside it; one whose characters lie within another's is inside it, but for an empty span
where another ends, which is inside it only when it is deeper (`depth`): `<a><img></a>` or `<a></a><img>`. The
pipeline returns the translated block with the same spans (each exactly once) placed over the target text.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class SpanKind(str, Enum):
    TAG = "tag"  # markup around words: placed around the target words its source words align to
    PLACEHOLDER = "placeholder"  # text the model must not see or change: restored exactly, once per occurrence


@dataclass(frozen=True, kw_only=True)
class Span:
    start: int  # character offsets into the block's text
    end: int
    open: str  # written before the span's text (a placeholder's whole text)
    close: str = ""  # written after it ("" for an empty element or a placeholder)
    kind: SpanKind = SpanKind.TAG
    depth: int = 0  # how many spans it lies inside: says whether an empty span where another ends is in it or after it


@dataclass(frozen=True, kw_only=True)
class Block:
    text: str  # plain text the model reads (entities decoded, markup out)
    spans: tuple[Span, ...] = ()  # properly nested, in the order written: by start, a span after those containing it
