"""A line cut into parts that the model translates one by one (a paragraph's sentences), with the text between them,
so that the line's translation is rebuilt with the line's own spacing.

The cutting itself lives above decoding (`mtkit.documents.sentences`, a sentence splitter): the `Translator` is given
a `Splitter` (as `files.translate_file` is given a `Chooser`) and only reads the parts it returns.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class LineParts:
    """`parts[0]`, `parts[1]`, ... with `spaces[k]` before part k and `spaces[-1]` after the last:
    `spaces[0] + parts[0] + spaces[1] + ... + parts[-1] + spaces[-1]` is the line again, exactly."""

    parts: tuple[str, ...]  # each stripped of surrounding whitespace, none empty
    spaces: tuple[str, ...]  # len(parts) + 1 (a line of whitespace alone: no parts, and the line as its one space)

    @classmethod
    def whole(cls, line: str) -> LineParts:
        """The line as one part (what the model reads when nothing cuts it)."""
        return cls((line,), ("", ""))

    def text(self) -> str:
        """The line the parts were cut from."""
        return self.spaces[0] + "".join(part + space for part, space in zip(self.parts, self.spaces[1:], strict=True))


class Splitter(Protocol):
    """Cuts a line into the parts the model translates one by one (`mtkit.documents.sentences.SentenceSplitter`,
    which lives above decoding: it reads a sentence splitter's rules by the source language)."""

    def cut(self, line: str) -> LineParts:
        """The line's parts and the spacing around them."""


def joined(texts: Sequence[str], between: Sequence[str]) -> str:
    """Translated parts joined by the spacing between their sources (`between[k]` between texts k and k + 1).

    Sources written without spaces between sentences (Chinese, Japanese) give an empty spacing; their
    translations get a space there unless a translation written without spaces is on either side.
    """
    if not texts:
        return ""
    found = [texts[0]]
    for text, space in zip(texts[1:], between, strict=True):
        if not space and not (_unspaced(found[-1][-1:]) or _unspaced(text[:1])):
            space = " "
        found += [space, text]
    return "".join(found)


def _unspaced(character: str) -> bool:
    """A character of a script written without spaces between words or sentences (wide: CJK and its punctuation)."""
    return bool(character) and unicodedata.east_asian_width(character) in ("W", "F")
