"""The request field `split_by`: each text cut into sentences (or not) before the batcher, checked with the other
fields (a bad value is 422 in one line), and the work bound counting the sentences."""

from __future__ import annotations

import asyncio
import json

import pytest
from copy_translator import copy_translator
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from mtkit.decoding.options import Decoding
from mtkit.documents.sentences import SentenceSplitter
from mtkit.serving.app import TranslateRequest, _decoding, _invalid_body
from mtkit.serving.batcher import Batcher
from mtkit.serving.limits import ServeLimits

PARAGRAPH = "Ein Hund läuft.  Zwei Männer stehen!"


def test_a_bad_split_by_is_422_in_one_line():
    with pytest.raises(ValidationError) as caught:
        TranslateRequest(text=["a"], split_by="words")
    reply = asyncio.run(_invalid_body(None, RequestValidationError(caught.value.errors())))
    detail = json.loads(reply.body)["detail"]
    assert reply.status_code == 422 and detail.startswith("split_by: Input should be 'sentences' or 'lines'")
    assert "\n" not in detail


@pytest.mark.parametrize(
    ("split_by", "recipe", "expected"), [(None, "sentences", 2), ("lines", "sentences", 1), (None, "lines", 1)]
)
def test_split_by_and_the_recipe_choose_the_splitter(split_by, recipe, expected):
    translator = copy_translator(split_by=recipe)
    decoding, splitter, _ = _decoding(translator, TranslateRequest(text=[PARAGRAPH], split_by=split_by), ServeLimits(), None)
    assert len(translator.plan([PARAGRAPH], decoding, splitter=splitter).sources) == expected


def test_the_work_bound_counts_the_sentences():
    translator = copy_translator()
    whole, cut = (translator.plan([PARAGRAPH], Decoding(), splitter=s).work for s in (None, SentenceSplitter("de")))
    assert cut > whole
    limits = ServeLimits(max_work=whole)
    _decoding(translator, TranslateRequest(text=[PARAGRAPH], split_by="lines"), limits, None)
    with pytest.raises(HTTPException) as caught:
        _decoding(translator, TranslateRequest(text=[PARAGRAPH]), limits, None)
    assert caught.value.status_code == 413 and f"this request may take {cut} decoding steps" in caught.value.detail


def test_the_batcher_keeps_requests_cut_otherwise_apart_and_rebuilds_each_line():
    translator = copy_translator()

    async def both() -> list[list[str]]:
        batcher = Batcher(translator, max_wait=0.2, max_queue=10, batch_lines=100)
        worker = asyncio.create_task(batcher.run())
        try:
            found = await asyncio.gather(
                batcher.translate([PARAGRAPH], Decoding(), splitter=SentenceSplitter("de")),
                batcher.translate([PARAGRAPH], Decoding()),
            )
        finally:
            worker.cancel()
        batcher.close()
        return [[best[0].text for best in lines] for lines in found]

    assert asyncio.run(both()) == [[PARAGRAPH], [" ".join(PARAGRAPH.split())]]
    assert sorted(len(batch.sources) for batch in translator.engine.batches) == [1, 2]
