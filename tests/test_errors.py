"""The user-facing error: one line, however many lines the library's message had."""

from __future__ import annotations

from mtkit.errors import MtkitError, one_line


def test_one_line_flattens_and_cuts_a_library_message():
    err = ValueError("first line\n   second\tline   \n" + "x" * 400)
    flat = one_line(err)
    assert "\n" not in flat and flat.startswith("first line second line x") and len(flat) == 160
    assert one_line(err, limit=10) == "first line"


def test_the_error_type_carries_its_message():
    assert str(MtkitError("data.yaml: key 'x' is unknown")) == "data.yaml: key 'x' is unknown"
