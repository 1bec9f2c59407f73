"""`mtkit translate --format F --split-by S` as a library call: a file in its format in, the same format out."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from mtkit.decoding.files import Chooser, translate_file
from mtkit.decoding.options import FileOptions
from mtkit.decoding.translator import Translator
from mtkit.distributed import Distributed
from mtkit.documents.formats import (
    DocumentFormat,
    DocumentLimits,
    check_retranslate,
    check_size,
    document_text,
    format_named,
    read_document,
)
from mtkit.documents.pipeline import translate_blocks
from mtkit.errors import MtkitError
from mtkit.options import SplitBy
from mtkit.textio import atomic_output


@dataclass(frozen=True, kw_only=True)
class DocumentOptions:
    """What `mtkit translate` was asked for: the file options, the input's format and what the translator reads at a time."""

    file: FileOptions = field(default_factory=FileOptions)
    format: str = "text"
    split_by: SplitBy = SplitBy.SENTENCES
    limits: DocumentLimits = field(default_factory=DocumentLimits)
    retranslate: bool = False  # a file of translation units: translate the units translated already too


def translate_document_file(
    translator: Translator, options: DocumentOptions, *, distributed: Distributed | None = None, chooser: Chooser | None = None
) -> int:
    """Translate `options.file.input` in its format into `options.file.output`; returns the number of blocks translated.

    A whole-file format is read at once (its size checked first), translated, and written in one atomic step, so a
    failure leaves no half-written output; under torchrun only the first rank translates it.
    """
    row = format_named(options.format)
    check_retranslate(row, retranslate=options.retranslate)
    if row.streams:
        return translate_file(translator, options.file, distributed=distributed, chooser=chooser)
    _check_whole_file(row, options.file)
    name = str(options.file.input) if options.file.input is not None else "<stdin>"
    data = _read_bounded(options.file.input, options.limits)
    text = document_text(data, name=name, limits=options.limits)
    document = read_document(row, text, name=name, limits=options.limits, retranslate=options.retranslate)
    if distributed is not None and not distributed.is_main:
        return 0  # a whole file is translated and written by the first rank alone
    translated = translate_blocks(translator, document.blocks, decoding=options.file.decoding, split_by=options.split_by)
    with atomic_output(options.file.output) as out:
        out.write(document.render(translated))
    return len(translated)


def _read_bounded(path: Path | None, limits: DocumentLimits) -> bytes:
    """The bytes of `path` (standard input when None), its size checked before it is read."""
    if path is None:
        data = sys.stdin.buffer.read(limits.max_bytes + 1)  # one byte past the bound tells a larger input
        check_size(len(data), name="<stdin>", limits=limits)
        return data
    if not path.is_file():
        raise MtkitError(f"{path}: no such file; give the document to translate")
    check_size(path.stat().st_size, name=str(path), limits=limits)
    return path.read_bytes()


def _check_whole_file(row: DocumentFormat, options: FileOptions) -> None:
    """Refuse the line-by-line options a whole-file format has no lines for."""
    given = {
        "--prefix": options.prefix,
        "--constraints": options.constraints,
        "--glossary": options.glossary,
        "--plot-attention": options.plot_attention,
    }
    for flag, value in given.items():
        if value is not None:
            raise MtkitError(f"{flag} {value}: works on plain text lines, not on --format {row.name}; use --format text")
