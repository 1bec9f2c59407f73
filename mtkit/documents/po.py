"""gettext PO files (`--format po`), read and written by translate-toolkit: each untranslated entry's msgid is
translated into its msgstr and the entry marked `fuzzy`, so a translator reviews every machine translation.

The header entry, comments, references, flags (`c-format`...), contexts and obsolete entries are written as they
were read; an entry that has a translation already is left alone unless `retranslate`. A plural entry's msgid
gives msgstr[0] and its msgid_plural every other form (the header's `nplurals`; with one form, the plural's
translation alone). A string is translated line by line (a help text's line breaks kept) and the whitespace
around it stays, so msgfmt's checks of leading and trailing newlines hold.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from translate.misc.multistring import multistring
from translate.storage import pypo

from mtkit.documents.blocks import Block
from mtkit.documents.formats import DocumentLimits
from mtkit.documents.tags import markup
from mtkit.errors import MtkitError, one_line

_LINE_BREAK = re.compile(r"(\s*\n\s*)")
MOST_PLURAL_FORMS = 6  # Arabic's: no language has more


@dataclass(frozen=True, kw_only=True)
class TextLines:
    """A string cut into the lines a model translates and the whitespace around and between them."""

    lines: tuple[str, ...]
    gaps: tuple[str, ...]  # one more than lines: before the first, between each two, after the last

    @classmethod
    def of(cls, text: str) -> TextLines:
        core = text.strip()
        lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]
        if not core:
            return cls(lines=(), gaps=(text,))
        pieces = _LINE_BREAK.split(core)
        return cls(lines=tuple(pieces[0::2]), gaps=(lead, *pieces[1::2], trail))

    def join(self, lines: Sequence[str]) -> str:
        """The string with `lines` in place of its lines, its whitespace as it was."""
        return "".join(gap + line for gap, line in zip(self.gaps, [*lines, ""], strict=True))


@dataclass(frozen=True, kw_only=True)
class Entry:
    """An entry to translate: its unit, and the lines of its msgid (and msgid_plural)."""

    unit: pypo.pounit
    strings: tuple[TextLines, ...]  # msgid, then msgid_plural for a plural entry


@dataclass(frozen=True, kw_only=True)
class PoDocument:
    """A PO file read by translate-toolkit; `blocks` are the lines of the entries to translate, in file order."""

    store: pypo.pofile
    entries: tuple[Entry, ...]
    forms: int  # msgstr[n] a plural entry has: the header's nplurals

    @property
    def blocks(self) -> list[Block]:
        return [Block(text=line) for entry in self.entries for string in entry.strings for line in string.lines]

    def render(self, translated: Sequence[Block]) -> str:
        """The file with each entry's translation in its msgstr, marked fuzzy; all else as read."""
        lines = iter([markup(block, escape=str) for block in translated])
        for entry in self.entries:
            singular, *plural = (string.join([next(lines) for _ in string.lines]) for string in entry.strings)
            if plural:
                others = [plural[0]] * (self.forms - 1)
                entry.unit.target = multistring([singular, *others] if others else plural)
            else:
                entry.unit.target = singular
            entry.unit.markfuzzy(True)
        return bytes(self.store).decode(self.store.encoding)


def read(text: str, *, name: str, limits: DocumentLimits, retranslate: bool = False) -> PoDocument:
    """The entries of a PO file to translate: those without a translation, or every one with `retranslate`."""
    try:
        store = pypo.pofile.parsestring(text.encode("utf-8"))
    except ValueError as err:
        raise MtkitError(f"{name}: not a PO file ({one_line(err)}); check it with msgfmt --check") from None
    entries = tuple(
        Entry(unit=unit, strings=tuple(TextLines.of(str(source)) for source in _sources(unit)))
        for unit in store.units
        if not (unit.isheader() or unit.isobsolete() or unit.isblank()) and (retranslate or not _translated(unit))
    )
    return PoDocument(store=store, entries=entries, forms=_plural_forms(store, name))


def _sources(unit: pypo.pounit) -> list[str]:
    """msgid, and msgid_plural for a plural entry."""
    return list(unit.source.strings[:2]) if unit.hasplural() else [unit.source]


def _translated(unit: pypo.pounit) -> bool:
    """Whether any msgstr holds text (a fuzzy draft counts: a person wrote it)."""
    target = unit.target
    return any(str(form) for form in target.strings) if isinstance(target, multistring) else bool(target)


def _plural_forms(store: pypo.pofile, name: str) -> int:
    """The header's nplurals, else 2 (msgid and msgid_plural: a template's header says nplurals=INTEGER); a count
    no language has is refused."""
    count, _ = store.getheaderplural()
    if count is None or not str(count).strip().isdigit():
        return 2
    if not 1 <= int(count) <= MOST_PLURAL_FORMS:
        raise MtkitError(
            f"{name}: the header's Plural-Forms says nplurals={count}; give a count from 1 to {MOST_PLURAL_FORMS} "
            "(the plural forms of the target language)"
        )
    return int(count)
