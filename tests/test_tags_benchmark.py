"""benchmarks/tags.py's scoring: an output caption's tags read back, well-formed or not, and the placement figures
against the tagged set's reference spans (the whole benchmark runs in its smoke mode in tests/system/test_benchmarks.py)."""

from __future__ import annotations

import pytest

from benchmarks.tags import read_fragment, tag_figures


@pytest.mark.parametrize(
    ("output", "text", "tags", "well_formed"),
    [
        ("A <b>big</b> dog &amp; a cat", "A big dog & a cat", {"b": (2, 5)}, True),
        ('<a href="x">a <i>b</i></a> c', "a b c", {"a": (0, 3), "i": (2, 3)}, True),
        ("<b>a <i>b</b> c</i>", "a b c", {"i": (2, 5)}, False),  # crossing
        ("a <b>b c", "a b c", {}, False),  # never closed
        ("a </b>b", "a b", {}, False),  # closed, never opened
    ],
)
def test_an_output_is_read_back_into_text_and_tags(output: str, text: str, tags: dict, well_formed: bool) -> None:
    fragment = read_fragment(output)
    assert (fragment.text, fragment.tags, fragment.well_formed) == (text, tags, well_formed)


def test_placement_compares_the_tagged_words_with_the_references() -> None:
    rows = [
        {"reference": "A big dog runs.", "tags": [{"name": "b", "reference": [2, 9]}, {"name": "i", "reference": [10, 14]}]},
        {"reference": "Two cats.", "tags": [{"name": "a", "reference": [0, 3]}]},
    ]
    outputs = ["A <b>Big dog</b> <i>runs.</i>", 'Two <a href="x">cats</a> <a href="x">.</a>']
    figures = tag_figures([read_fragment(output) for output in outputs], rows)
    assert figures["well_formed"] == 1.0
    assert figures["tags_kept"] == 2 / 3  # the <a> came back twice
    assert figures["placement_exact"] == 1 / 3  # "runs ." is not "runs"; case aside, "big dog" is
    assert figures["tags_whose_words_are_present"] == 3
    assert figures["placement_overlap_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
