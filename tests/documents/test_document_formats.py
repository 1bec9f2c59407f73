"""The documents stage's bounds: a whole file's size checked before it is read, a binary file refused in one line."""

from __future__ import annotations

import pytest

from mtkit.documents.formats import (
    FORMATS,
    DocumentLimits,
    DocumentTooLarge,
    check_shape,
    check_size,
    document_text,
    format_named,
)
from mtkit.errors import MtkitError


def test_a_document_is_decoded_without_its_byte_order_mark() -> None:
    assert document_text("\ufeff<p>Grüße</p>".encode(), name="page.html", limits=DocumentLimits()) == "<p>Grüße</p>"


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"<p>a\x00b</p>", "page.html: a binary file (NUL byte at offset 4)"),
        (b"<p>\xff</p>", "page.html: not UTF-8 text (byte 0xff at offset 3)"),
    ],
)
def test_a_binary_file_is_refused_in_one_line(data: bytes, said: str) -> None:
    with pytest.raises(MtkitError) as caught:
        document_text(data, name="page.html", limits=DocumentLimits())
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


def test_sizes_past_the_limits_are_refused() -> None:
    limits = DocumentLimits(max_bytes=10, max_depth=3, max_tags=5)
    check_size(10, name="page.html", limits=limits)
    check_shape(name="page.html", depth=3, tags=5, limits=limits)
    with pytest.raises(DocumentTooLarge, match="page.html: 11 bytes, more than the 10"):
        check_size(11, name="page.html", limits=limits)
    with pytest.raises(DocumentTooLarge, match="nested more than 3 deep"):
        check_shape(name="page.html", depth=4, tags=1, limits=limits)
    with pytest.raises(DocumentTooLarge, match="more than 5 tags"):
        check_shape(name="page.html", depth=1, tags=6, limits=limits)
    with pytest.raises(DocumentTooLarge, match="page.html: 11 bytes"):
        document_text(b"x" * 11, name="page.html", limits=limits)


def test_an_unknown_format_is_one_line_naming_the_option_and_the_formats() -> None:
    with pytest.raises(MtkitError, match=r"^--format 'docx': not a format mtkit reads; give one of text, html") as found:
        format_named("docx")
    assert all(name in str(found.value) for name in FORMATS) and "\n" not in str(found.value)
