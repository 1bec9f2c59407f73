"""Hostile requests against a real `mtkit serve` on loopback, drawn by hypothesis: every answer is
200, a 4xx with a one-line `detail`, 503 or 504, never a 500, and the server goes on answering."""

from __future__ import annotations

import json
import math
import os

import pytest
from helpers import Reply, request, serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtkit.serving.app import ServeLimits, TranslateRequest

CI = os.environ.get("CI") == "true"

# JSON of any shape: what a confused or hostile client sends where a field's value belongs.
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40) | st.sampled_from(
    ["a b c", "", " ", "a " * 150, "\u202e\u0301", "\ufeffa", "d\r\ne"]
)
NUMBER = st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True) | ANY_JSON
PHRASE = TEXT | st.lists(TEXT, max_size=3)
TINY = st.sampled_from([1e-300, 5e-324, 1e-38, 0.009, 0.01, 100.0, 100.5, 1e308])  # beside the temperature's range
LANGUAGE = st.sampled_from(["de", "en", "rv", "zz", "deu_Latn", "", "x" * 40]) | ANY_JSON
# Each field of the request with draws of its own; a field added to TranslateRequest must be added here
# (test_every_field_of_the_request_is_fuzzed).
DRAWS = {
    "text": st.lists(TEXT, max_size=10) | ANY_JSON,
    "beam": st.integers(-3, 80) | NUMBER,
    "nbest": st.integers(-3, 80) | NUMBER,
    "length_penalty": st.floats(-1, 20) | NUMBER,
    "prefix": st.lists(TEXT, max_size=10) | ANY_JSON,
    "sampling": st.sampled_from(["topk:3", "topp:0.9", "full", "topk:0", "topp:2", "top", ""]) | ANY_JSON,
    "temperature": st.floats(-1, 100) | TINY | NUMBER,
    "seed": NUMBER,
    "no_repeat_ngram": st.integers(-3, 100) | NUMBER,
    "alignments": st.booleans() | ANY_JSON,
    "constraints": st.lists(st.lists(PHRASE, max_size=20), max_size=10) | ANY_JSON,
    "constraints_order": st.sampled_from(["any", "given", "sorted"]) | ANY_JSON,
    "tgt_lang": LANGUAGE,
    "src_lang": LANGUAGE,
    "rerank": st.sampled_from(["mbr", "qe", "MBR", ""]) | ANY_JSON,
    "candidates": st.integers(-3, 80) | NUMBER,
    "mbr_utility": st.sampled_from(["chrf", "comet", "bleu"]) | ANY_JSON,
    "shortlist": st.booleans() | ANY_JSON,
    "format": st.sampled_from(["text", "html", "xml", "po", "xliff", "HTML", "markdown", ""]) | ANY_JSON,
}
FIELDS = {name: DRAWS.get(name, ANY_JSON) for name in TranslateRequest.model_fields}
BODY = st.fixed_dictionaries({}, optional=FIELDS) | st.dictionaries(st.text(max_size=10), ANY_JSON, max_size=4)
ODD = [b"", b"null", b"[]", b'{"text": NaN}', b'{"text": ["a"]' + b"}" * 3, b"[" * 5000, b'{"text": ["\xff\xfe"]}']
RAW = st.binary(max_size=200) | st.sampled_from(ODD)


@pytest.fixture(scope="module")
def server(reverse_pytorch):
    limits = ServeLimits(max_lines=8, max_chars=400, max_wait_ms=5, max_work=20_000, request_timeout=20)
    with serving(reverse_pytorch, limits) as (port, _):
        yield port


def test_every_field_of_the_request_is_fuzzed():
    assert set(DRAWS) == set(TranslateRequest.model_fields)


def check(reply: Reply) -> None:
    assert reply.status in (200, 503, 504) or 400 <= reply.status < 500, reply
    if 400 <= reply.status < 500 or reply.status in (503, 504):
        assert isinstance(reply.body.get("detail"), str) and "\n" not in reply.body["detail"], reply.body
        assert "Traceback" not in reply.body["detail"]


def still_serving(port: int) -> None:
    reply = request(port, "POST", "/translate", {"text": ["a b c"]})
    assert reply.status == 200 and reply.body["translations"] == ["c b a"], reply


FUZZ = settings(
    max_examples=300 if CI else 60,
    derandomize=CI,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.slow
@FUZZ
@given(body=BODY)
def test_any_request_body_is_answered_without_a_server_error(server, body):
    data = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    reply = request(server, "POST", "/translate", data)
    check(reply)
    if reply.status == 200:
        assert len(reply.body["translations"]) == len(body["text"])
        scores = [t["score"] for row in reply.body["translations"] if isinstance(row, list) for t in row]
        assert all(math.isfinite(score) for score in scores)
    still_serving(server)


@pytest.mark.slow
@settings(FUZZ, max_examples=100 if CI else 30)
@given(data=RAW, path=st.sampled_from(["/translate", "/info", "/health", "/nowhere"]))
def test_any_bytes_to_any_path_are_answered_without_a_server_error(server, data, path):
    check(request(server, "POST", path, data))
    still_serving(server)
