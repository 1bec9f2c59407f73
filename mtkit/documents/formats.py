"""The document formats, one row each: `mtkit translate --format NAME` reads a file through its row.

A row names the module that reads a file into blocks (`blocks.Block`) and writes translated blocks back. A
streaming format (text) is read and written a window of lines at a time; the others are read whole, after their
size is checked. Adding a format is one module and one row here; nothing else names a format.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtkit.errors import MtkitError


@dataclass(frozen=True, kw_only=True)
class DocumentFormat:
    name: str  # the --format value and the request field's
    module: str  # mtkit.documents.<module>, imported when the format is used
    help: str  # one line for --help and the docs
    streams: bool = False  # lines read and written in windows; else the file is read whole


FORMATS: dict[str, DocumentFormat] = {
    row.name: row
    for row in (
        DocumentFormat(name="text", module="", help="plain text, one paragraph a line", streams=True),
        DocumentFormat(
            name="markdown",
            module="markdown",
            help="Markdown (CommonMark, tables): paragraphs, headings, list items and cells; code left as it is",
        ),
    )
}


def format_named(name: str) -> DocumentFormat:
    """The row of `name`; one line naming the valid names when there is none."""
    if name not in FORMATS:
        raise MtkitError(f"format {name!r} is not one of mtkit's: give one of {', '.join(FORMATS)}")
    return FORMATS[name]
