"""The document formats, one row each: `mtkit translate --format NAME` reads a file through its row.

A row names the module that reads a file into blocks (`blocks.Block`) and writes translated blocks back. A
streaming format (text) is read and written a window of lines at a time; the others are read whole, after their
size is checked. Adding a format is one module and one row here; nothing else names a format.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from mtkit.documents.blocks import Block
from mtkit.errors import MtkitError


@dataclass(frozen=True, kw_only=True)
class DocumentLimits:
    """How much of a document a format reads, checked before the work it would cost: the file's size, how deep its
    elements nest and how many tags it holds (a parser's memory and time grow with each)."""

    max_bytes: int = 16 * 1024 * 1024
    max_depth: int = 256
    max_tags: int = 200_000


class Document(Protocol):
    """A file read by its format: its blocks in reading order, and the file written back around translated blocks."""

    @property
    def blocks(self) -> Sequence[Block]: ...

    def render(self, translated: Sequence[Block]) -> str:
        """The file's text with each block replaced by its translation (same order, same number); the rest as read."""
        ...


class FormatReader(Protocol):
    """What a format's module defines: `read(text, *, name, limits) -> Document` (`name` for its error messages,
    which are one line; a bound passed is an `DocumentTooLarge`)."""

    def read(self, text: str, *, name: str, limits: DocumentLimits) -> Document: ...


class UnitsReader(Protocol):
    """A format of translation units (a row with `units`): `retranslate` reads the units translated already too,
    which are otherwise written back as they were."""

    def read(self, text: str, *, name: str, limits: DocumentLimits, retranslate: bool) -> Document: ...


class DocumentTooLarge(MtkitError):
    """A document past one of its `DocumentLimits` (the server answers 413)."""


@dataclass(frozen=True, kw_only=True)
class DocumentFormat:
    name: str  # the --format value and the request field's
    module: str  # mtkit.documents.<module>, imported when the format is used
    help: str  # one line for --help and the docs
    streams: bool = False  # lines read and written in windows; else the file is read whole
    units: bool = False  # a file of translation units: one translated already is kept unless --retranslate


FORMATS: dict[str, DocumentFormat] = {
    row.name: row
    for row in (
        DocumentFormat(name="text", module="", help="plain text, one paragraph a line", streams=True),
        DocumentFormat(name="html", module="html", help="HTML, a page or a fragment: inline tags kept around their words"),
        DocumentFormat(
            name="xml", module="xml", help="XML: elements with text translated, inline elements kept around their words"
        ),
        DocumentFormat(
            name="markdown",
            module="markdown",
            help="Markdown (CommonMark, tables): paragraphs, headings, list items and cells; code left as it is",
        ),
        DocumentFormat(name="po", module="po", help="a gettext PO file: msgstr filled and marked fuzzy", units=True),
        DocumentFormat(name="xliff", module="xliff", help="an XLIFF 1.2 or 2.0 file: targets filled, for review", units=True),
    )
}


def check_size(size: int, *, name: str, limits: DocumentLimits) -> None:
    """Refuse a document of `size` bytes past `limits.max_bytes`, before it is read."""
    if size > limits.max_bytes:
        raise DocumentTooLarge(
            f"{name}: {size} bytes, more than the {limits.max_bytes} a document may have; split it into smaller files"
        )


def check_shape(*, name: str, depth: int, tags: int, limits: DocumentLimits) -> None:
    """Refuse a document whose elements nest deeper, or that holds more tags, than `limits` allow (a format calls it
    as it walks, so the walk stops at the bound)."""
    if depth > limits.max_depth:
        raise DocumentTooLarge(f"{name}: elements nested more than {limits.max_depth} deep; flatten the document")
    if tags > limits.max_tags:
        raise DocumentTooLarge(f"{name}: more than {limits.max_tags} tags; split the document into smaller files")


def document_text(data: bytes, *, name: str, limits: DocumentLimits) -> str:
    """The text of a whole-file document's bytes: bounded, and a binary file (NUL bytes, not UTF-8) refused."""
    check_size(len(data), name=name, limits=limits)
    nul = data.find(b"\0")
    if nul >= 0:
        raise MtkitError(f"{name}: a binary file (NUL byte at offset {nul}); give a text document in UTF-8")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        raise MtkitError(
            f"{name}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); convert the file to UTF-8"
        ) from None


def read_document(row: DocumentFormat, text: str, *, name: str, limits: DocumentLimits, retranslate: bool = False) -> Document:
    """`text` read into blocks by `row`'s module (with `retranslate`, a file of units gives those translated already)."""
    module = importlib.import_module(f"mtkit.documents.{row.module}")
    if row.units:
        units: UnitsReader = module  # type: ignore[assignment]
        return units.read(text, name=name, limits=limits, retranslate=retranslate)
    check_retranslate(row, retranslate=retranslate)
    reader: FormatReader = module  # type: ignore[assignment]
    return reader.read(text, name=name, limits=limits)


def check_retranslate(row: DocumentFormat, *, retranslate: bool) -> None:
    """Refuse --retranslate for a format without translation units (nothing in it is translated already)."""
    if retranslate and not row.units:
        kept = ", ".join(other.name for other in FORMATS.values() if other.units)
        raise MtkitError(f"--retranslate: a {row.name} file holds no translations to redo; it works with --format {kept}")


def format_named(name: str) -> DocumentFormat:
    """The row of `name`; one line naming the valid names when there is none."""
    if name not in FORMATS:
        raise MtkitError(f"--format {name!r}: not a format mtkit reads; give one of {', '.join(FORMATS)}")
    return FORMATS[name]
