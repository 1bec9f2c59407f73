"""Inline markup put back over a translation by its word alignments, and a block written out with its markup.

Words are the block's whitespace-separated tokens: those of mtkit's alignments (`decoding.alignment`, where a
SentencePiece word starts at each "▁", i.e. after whitespace). With an aligner's links (`documents.aligner`, eflomal
guided by the run's priors) they are finer: `tokens`, each word cut into its words and punctuation marks, so a tag
around "Hut" in "Hut," can go around "hat" in "hat,". A tag goes around the hull of the target words its
source words align to; an empty span (an empty element, a placeholder) or a span with no aligned word goes after the
target word aligned to the nearest source word before it (else at the start). Hulls that cross are repaired so the
output nests as the source did: a child is clipped inside its parent, siblings are kept apart (the later one starts
where the earlier ends, or becomes empty there).

Nesting is containment: a span whose characters lie within another's is inside it (for an empty span where
another ends, when it is deeper), so spans are listed parents first and, among siblings, in the order they are
written.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import re
import unicodedata
from collections.abc import Callable, Sequence

from mtkit.data import word_alignment
from mtkit.decoding.translator import Translation
from mtkit.documents.blocks import Block, Span, SpanKind

TOKEN = re.compile(r"(?:\S|[\x0b\x1c-\x1f\x85])+")
TOKEN_IN_WORD = word_alignment.TOKEN
# How SentencePiece's default normaliser (nmt_nfkc) cuts words where Python's str.split does not: characters it turns
# into a space, Python whitespace that does not separate words, and control characters it drops.
SPACED = frozenset("\u061c\u200b\u200c\u200e\u200f\u2581\ufeff\ufffd")
KEPT = frozenset("\x0b\x1c\x1d\x1e\x1f\x85")
DROPPED = frozenset([*map(chr, range(0x01, 0x09)), "\x0b", *map(chr, range(0x0E, 0x20)), "\x7f", "\x8f", "\x9f"])
Gaps = tuple[int, int]  # a span over target words [start, end) in word positions; start == end: empty, before word `start`


def place_spans(block: Block, translation: Translation, *, token_links: Sequence[tuple[int, int]] | None = None) -> Block:
    """The translated block: `translation`'s text with every span of `block` placed over it exactly once.

    token_links: (source token, target token) pairs of `tokens` of the two texts, from an aligner
    (`documents.aligner`); None: the translation's own word alignment, from the model's attention.
    """
    if not block.spans:
        return Block(text=translation.text)
    if token_links is not None:
        target_words = tokens(translation.text)
        source_words = _SourceWords(tokens(block.text), token_links, len(target_words))
    else:
        target_words = words(translation.text)
        pairs = translation.source_alignment if translation.source_alignment is not None else translation.alignment
        source_words = _SourceWords(words(block.text), pairs or [], len(target_words))
    wanted = [source_words.wanted(span) for span in block.spans]
    children = span_tree(block.spans)
    placed: list[Span] = []

    def place(parent: int | None, gaps: Gaps, chars: tuple[int, int], depth: int) -> None:
        for child, child_gaps in _apart([(c, wanted[c]) for c in children[parent]], gaps):
            start = min(max(_char(child_gaps[0], target_words, end=False), chars[0]), chars[1])
            end = max(min(_char(child_gaps[1], target_words, end=True), chars[1]), start)
            if child_gaps[0] == child_gaps[1]:
                end = start
            placed.append(dataclasses.replace(block.spans[child], start=start, end=end, depth=depth))
            place(child, child_gaps, (start, end), depth + 1)

    place(None, (0, len(target_words)), (0, len(translation.text)), 0)
    return Block(text=translation.text, spans=tuple(placed))


def markup(block: Block, *, escape: Callable[[str], str]) -> str:
    """The block's text with its spans written in: `escape`d text, a tag's markup as it is, a placeholder escaped."""
    out: list[str] = []
    stack: list[Span] = []
    written = 0

    def close() -> None:
        nonlocal written
        span = stack.pop()
        out.append(escape(block.text[written : span.end]) + span.close)
        written = span.end

    for span in block.spans:
        while stack and not _contains(stack[-1], span):
            close()
        out.append(escape(block.text[written : span.start]))
        out.append(escape(span.open) if span.kind is SpanKind.PLACEHOLDER else span.open)
        written = span.start
        stack.append(span)
    while stack:
        close()
    out.append(escape(block.text[written:]))
    return "".join(out)


def plain(block: Block) -> str:
    """The block's text with its placeholders, its tags left out: what a metric compares with a reference."""
    kept = tuple(span for span in block.spans if span.kind is SpanKind.PLACEHOLDER)
    return markup(Block(text=block.text, spans=kept), escape=lambda text: text)


def words(text: str) -> list[tuple[int, int]]:
    """(start, end) of each word of `text` as mtkit's alignments number them: the words SentencePiece starts with
    "▁" once it has normalised the text. They are the whitespace-separated tokens but for a few characters: those
    NFKC turns into spaces (and `SPACED`) separate words, one NFKC starts with a space starts a word, `KEPT` ones
    do not separate, and a token of `DROPPED` ones is no word."""
    found = []
    for match in TOKEN.finditer(text, len(text) - len(text.lstrip()), len(text.rstrip())):  # stripped as model_text does
        if match.group().isascii() and match.group().isprintable():
            found.append(match.span())
            continue
        start = None
        for position in range(match.start(), match.end() + 1):
            boundary = _boundary(text[position]) if position < match.end() else "space"
            if boundary and start is not None:
                found.extend([(start, position)] if any(c not in DROPPED for c in text[start:position]) else [])
                start = None
            if boundary != "space" and start is None:
                start = position
    return found


def tokens(text: str) -> list[tuple[int, int]]:
    """(start, end) of each token of `text` that word alignment reads (`word_alignment.TOKEN`: a word or one
    punctuation mark), within the words of `words`."""
    return [match.span() for start, end in words(text) for match in TOKEN_IN_WORD.finditer(text, start, end)]


@functools.lru_cache(maxsize=4096)
def _boundary(char: str) -> str:
    """ "space" for a character SentencePiece reads as a space, "start" for one that starts a word, else ""."""
    normal = unicodedata.normalize("NFKC", char)
    if char in KEPT:
        return ""
    if char in SPACED or normal.isspace():
        return "space"
    return "start" if normal[:1].isspace() else ""


def clipped(span: Span, *, start: int, end: int) -> Span:
    """`span` clipped to characters [start, end) of its block and counted from `start` (a block cut from a longer
    text: the whitespace around its words left out)."""
    return dataclasses.replace(span, start=min(max(span.start, start), end) - start, end=min(max(span.end, start), end) - start)


def _contains(outer: Span, inner: Span) -> bool:
    """Whether `inner`, listed after `outer`, is inside it: an empty span where `outer` ends is, when it is deeper."""
    within = outer.start <= inner.start and inner.end <= outer.end
    return within and (inner.start < outer.end or inner.depth > outer.depth)


def span_tree(spans: Sequence[Span]) -> dict[int | None, list[int]]:
    """The indices of the spans directly inside each span (None: the block's top level), by containment, in order."""
    children: dict[int | None, list[int]] = {None: []}
    stack: list[int] = []
    for index, span in enumerate(spans):
        while stack and not _contains(spans[stack[-1]], span):
            stack.pop()
        children[stack[-1] if stack else None].append(index)
        children[index] = []
        stack.append(index)
    return children


class _SourceWords:
    """The block's words with the target words aligned to each (pairs past either side's words left out), and where
    an empty span after each would go; searched by character offset in logarithmic time."""

    def __init__(self, found: Sequence[tuple[int, int]], pairs: Sequence[tuple[int, int]], target_count: int) -> None:
        self.starts, self.ends = [start for start, _ in found], [end for _, end in found]
        self.targets: list[list[int]] = [[] for _ in found]
        for source, target in pairs:
            if source < len(found) and target < target_count:
                self.targets[source].append(target)
        self.after: list[int] = []  # per word: the gap after the last target of the nearest aligned word up to it
        for aligned in self.targets:
            self.after.append(max(aligned) + 1 if aligned else self.after[-1] if self.after else 0)

    def wanted(self, span: Span) -> Gaps:
        """Where a span would go alone: around the hull of its words' targets, else empty after the nearest aligned
        target of a source word before it."""
        first, last = bisect.bisect_right(self.ends, span.start), bisect.bisect_left(self.starts, span.end)
        targets = [target for aligned in self.targets[first:last] for target in aligned]
        if span.start < span.end and targets:
            return min(targets), max(targets) + 1
        before = bisect.bisect_left(self.starts, span.start) - 1
        position = self.after[before] if before >= 0 else 0
        return position, position


def _apart(children: Sequence[tuple[int, Gaps]], parent: Gaps) -> list[tuple[int, Gaps]]:
    """Children clipped inside the parent and kept apart, in the order they are written (an empty one before a
    sibling that starts where it is)."""
    low, high = parent
    clipped = []
    for child, (start, end) in children:
        start, end = min(max(start, low), high), max(min(end, high), low)
        clipped.append((child, (start, end) if start < end else (start, start)))
    kept, reach = [], low
    for child, (start, end) in sorted((c for c in clipped if c[1][0] < c[1][1]), key=lambda c: c[1]):
        start = max(start, reach)
        kept.append((child, (start, end) if start < end else (reach, reach)))
        reach = max(reach, end)
    filled = [gaps for _, gaps in kept if gaps[0] < gaps[1]]
    for child, (position, _) in (c for c in clipped if c[1][0] == c[1][1]):
        inside = next((end for start, end in filled if start < position < end), position)
        kept.append((child, (inside, inside)))
    return sorted(kept, key=lambda c: (c[1], c[0]))


def _char(position: int, words: Sequence[tuple[int, int]], *, end: bool) -> int:
    """The character offset of a word position: a span's start is its first word's start, its end its last word's end;
    an empty span sits right after the word before it."""
    if not words:
        return 0
    if end or position >= len(words):
        return words[position - 1][1] if position > 0 else 0
    return words[position][0]
