"""POST /translate with `format`: documents in, documents out, their markup kept; bounds 413, bad XML 400."""

from __future__ import annotations

import pytest
from helpers import serving, translate

from mtkit.serving.app import ServeLimits


@pytest.fixture(scope="module")
def server(reverse_pytorch):
    with serving(reverse_pytorch, ServeLimits(max_lines=8, max_chars=2_000, max_wait_ms=5)) as (port, _):
        yield port


def test_documents_come_back_translated_with_their_markup(server):
    reply = translate(server, ["<p>a b c</p><p><i>d e f g</i></p>", "<!-- x --><h1>h i j</h1>"], format="html")
    assert reply.status == 200, reply
    assert reply.body["translations"] == ["<p>c b a</p><p><i>g f e d</i></p>", "<!-- x --><h1>j i h</h1>"]
    xml = translate(server, ['<doc><p>a b c</p><p translate="no">a b c</p></doc>'], format="xml")
    assert xml.body["translations"] == ['<doc><p>c b a</p><p translate="no">a b c</p></doc>']


def test_documents_past_the_bounds_or_not_well_formed_are_refused_in_one_line(server):
    deep = translate(server, ["<div>" * 300 + "a b c"], format="html")
    assert deep.status == 413 and deep.body["detail"].startswith("text[0]: elements nested more than")
    many = translate(server, ["<p>a b c</p>" * 9], format="html")
    assert many.status == 413 and "9 blocks of text" in many.body["detail"]
    bad = translate(server, ["<doc>\n<p>a</doc>"], format="xml")
    assert bad.status == 400 and bad.body["detail"].startswith("text[0]:2:")
    assert translate(server, ["<p>a</p>"], format="pdf").status == 422
