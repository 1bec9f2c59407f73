"""`mtkit translate --format F --split-by S` as a library call: a file in its format in, the same format out."""

from __future__ import annotations

from dataclasses import dataclass, field

from mtkit.decoding.files import Chooser, translate_file
from mtkit.decoding.options import FileOptions
from mtkit.decoding.translator import Translator
from mtkit.distributed import Distributed
from mtkit.documents.formats import format_named
from mtkit.errors import MtkitError
from mtkit.options import SplitBy


@dataclass(frozen=True, kw_only=True)
class DocumentOptions:
    """What `mtkit translate` was asked for: the file options, the input's format and what the translator reads at a time."""

    file: FileOptions = field(default_factory=FileOptions)
    format: str = "text"
    split_by: SplitBy = SplitBy.SENTENCES


def translate_document_file(
    translator: Translator, options: DocumentOptions, *, distributed: Distributed | None = None, chooser: Chooser | None = None
) -> int:
    """Translate `options.file.input` in its format into `options.file.output`; returns the number of blocks translated."""
    row = format_named(options.format)
    if row.streams:
        return translate_file(translator, options.file, distributed=distributed, chooser=chooser)
    raise MtkitError(f"--format {row.name}: not readable yet")
