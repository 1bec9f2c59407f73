"""A request of documents (`format`): read within the server's limits before any work, one line on what is wrong."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from mtkit.serving.app import ServeLimits, TranslateRequest, _documents

LIMITS = ServeLimits(max_lines=4, max_chars=200)


def refused(limits: ServeLimits = LIMITS, **fields: object) -> HTTPException:
    with pytest.raises(HTTPException) as caught:
        _documents(TranslateRequest(**fields), limits, placed_by_model=True)
    assert "\n" not in caught.value.detail
    return caught.value


def test_a_request_of_documents_is_one_of_their_blocks_with_alignments_where_the_model_places_tags() -> None:
    request = TranslateRequest(text=["<p>a <b>b</b></p><p>c</p>", "<h1>d</h1>"], format="html")
    body, documents = _documents(request, LIMITS, placed_by_model=True)
    assert body.text == ["a b", "c", "d"] and body.alignments and documents is not None
    assert not _documents(request, LIMITS, placed_by_model=False)[0].alignments  # an aligner places them: no attention
    assert _documents(TranslateRequest(text=["<p>a</p>"]), LIMITS, placed_by_model=True)[1] is None  # text: as it is


def test_documents_past_the_bounds_are_413() -> None:
    deep = refused(text=["<div>" * 300 + "x"], format="html", limits=ServeLimits(max_chars=5_000))
    assert deep.status_code == 413 and "text[0]: elements nested more than" in deep.detail
    blocks = refused(text=["<p>a</p>" * 5], format="html")
    assert blocks.status_code == 413 and "5 blocks of text" in blocks.detail
    assert refused(text=["<p>" + "a " * 150 + "</p>"], format="html").status_code == 413


def test_bad_xml_and_options_with_no_sentence_to_go_with_are_400() -> None:
    bad = refused(text=["<a>ok</a>", "<a>\n<b></a>"], format="xml")
    assert bad.status_code == 400 and bad.detail.startswith("text[1]:2:")
    assert refused(text=["<p>a</p>"], format="html", prefix=["x"]).status_code == 400
    assert refused(text=["<p>a</p>"], format="html", nbest=2).status_code == 400
