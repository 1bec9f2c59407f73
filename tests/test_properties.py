"""Property-based: any bytes decode to lines or give one error line (hostile text through the commands and
a trained model is in tests/integration/test_properties.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtkit.errors import MtkitError
from mtkit.textio import decode_lines

FAST = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(data=st.binary(max_size=200))
def test_any_bytes_decode_to_lines_or_a_one_line_error(data):
    try:
        lines = decode_lines(data, "input.txt")
    except MtkitError as err:
        assert str(err).startswith("input.txt:") and "\n" not in str(err)
        return
    text = data.decode("utf-8").removeprefix("\ufeff")
    assert len(lines) == text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    assert all("\n" not in line for line in lines)
