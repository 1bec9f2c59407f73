"""POST /translate with `rerank`: each sentence's translation chosen among its candidates by the server's COMET-QE
model (the tiny checkpoint of tests/fixtures/comet/) or by minimum Bayes risk, a bad reranking a 400 in one line, and
a reranking bounded as decoding is: its work counted before queueing, stopped at the deadline or when the client
leaves, and at most --max-reranks at once."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import request, serving

from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.comet.scorer import CometScorer
from mtkit.evaluation.rerank import Reranker, RerankOptions
from mtkit.serving.app import ServeLimits

COMET = Path(__file__).resolve().parents[2] / "fixtures" / "comet"
TEXT = ["a b c d", "e f g", "h i j k l", ""]


@pytest.fixture(scope="module")
def comet() -> CometScorer:
    return CometScorer.load(CometOptions(model=str(COMET / "referenceless"), encoder=COMET / "tiny-xlmr", device="cpu"))


@pytest.fixture(scope="module")
def server(reverse_pytorch, comet):
    with serving(reverse_pytorch, ServeLimits(), comet=comet) as (port, _):
        yield port


def candidates(port: int) -> list[list[str]]:
    reply = request(port, "POST", "/translate", {"text": TEXT, "beam": 4, "nbest": 4})
    assert reply.status == 200, reply.body
    return [[found["text"] for found in line] for line in reply.body["translations"]]


def test_rerank_qe_answers_the_candidate_the_qe_model_scores_highest(server, comet):
    reply = request(server, "POST", "/translate", {"text": TEXT, "beam": 4, "rerank": "qe", "candidates": 4})
    assert reply.status == 200, reply.body
    for source, line, chosen in zip(TEXT, candidates(server), reply.body["translations"], strict=True):
        texts = list(dict.fromkeys(line))
        scores = comet.score([source] * len(texts), texts) if len(texts) > 1 else [0.0]
        assert chosen == texts[scores.index(max(scores))]


def test_rerank_mbr_answers_the_consensus_candidate(server):
    reply = request(server, "POST", "/translate", {"text": TEXT, "beam": 4, "rerank": "mbr", "candidates": 4})
    assert reply.status == 200, reply.body
    mbr = Reranker(RerankOptions(method="mbr", candidates=4))
    for source, line, chosen in zip(TEXT, candidates(server), reply.body["translations"], strict=True):
        values = mbr.mbr_values([source], [Counter(line)])[0]
        assert chosen == list(dict.fromkeys(line))[values.index(max(values))]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"rerank": "mbr"}, "rerank mbr chooses among candidates: give candidates N of 2 or more"),
        ({"rerank": "mbr", "candidates": 4, "beam": 2}, "candidates 4 with a beam of 2: a beam search finds at most its size"),
        ({"rerank": "mbr", "candidates": 2, "nbest": 2}, "nbest 2 with rerank: reranking returns one translation"),
        ({"candidates": 3}, "candidates 3 without rerank"),
        ({"rerank": "mbr", "candidates": 2, "mbr_utility": "comet"}, "is reference-free (QE); mbr_utility comet needs"),
    ],
)  # fmt: skip
def test_a_reranking_the_server_cannot_do_is_a_400_in_one_line(server, body, said):
    reply = request(server, "POST", "/translate", {"text": TEXT, **body})
    assert reply.status == 400 and said in reply.body["detail"] and "\n" not in reply.body["detail"], reply.body


def test_rerank_qe_without_a_comet_model_is_a_400_naming_the_servers_option(reverse_pytorch):
    with serving(reverse_pytorch, ServeLimits()) as (port, _):
        reply = request(port, "POST", "/translate", {"text": TEXT, "beam": 4, "rerank": "qe", "candidates": 4})
    assert reply.status == 400 and reply.body["detail"].startswith("rerank qe needs --comet-model M"), reply.body


def test_the_reviews_costly_reranking_is_413_stating_its_work_before_it_is_queued(server):
    body = {"text": ["a b c"] * 33, "sampling": "full", "temperature": 100, "rerank": "mbr", "candidates": 64}
    reply = request(server, "POST", "/translate", body)
    assert reply.status == 413 and "\n" not in reply.body["detail"], reply.body
    detail = reply.body["detail"]
    assert "decoding steps" in detail and "and 133056 of reranking (33 sentences x 4032 chrF scorings)" in detail
    assert "the limit is 30000" in detail


class GatedQE:
    """A COMET-QE model's stand-in, as slow as a test needs: each scoring call (of one candidate: batch_size 1)
    waits for `gate`, then scores the candidate by its length."""

    needs_references = False

    def __init__(self) -> None:
        self.options = CometOptions(model="gated-qe", batch_size=1)
        self.gate, self.entered, self.calls = threading.Event(), threading.Event(), 0

    def score(self, sources: list[str], translations: list[str], references: list[str] | None = None) -> list[float]:
        self.entered.set()
        self.gate.wait(timeout=10)
        self.calls += 1
        return [float(len(text)) for text in translations]


QE_BODY = {"text": TEXT[:3], "beam": 4, "rerank": "qe", "candidates": 4}  # several scoring calls


def wait_until(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_past_its_deadline_a_reranking_is_504_and_stops_at_its_next_chunk(reverse_pytorch):
    qe = GatedQE()
    with serving(reverse_pytorch, ServeLimits(request_timeout=1), comet=qe) as (port, app):
        reply = request(port, "POST", "/translate", QE_BODY)
        assert reply.status == 504 and "longer than the server's limit of 1 s" in reply.body["detail"], reply.body
        assert qe.entered.is_set()  # the deadline came during the reranking
        qe.gate.set()  # the scoring call under way ends; no other starts
        assert wait_until(lambda: app.state.reranks.stopped == 1)
        assert qe.calls == 1 and app.state.reranks.held == 0


@pytest.mark.slow
def test_a_client_that_disconnects_mid_reranking_stops_it(reverse_pytorch):
    qe = GatedQE()
    with serving(reverse_pytorch, ServeLimits(request_timeout=0), comet=qe) as (port, app):
        gone = socket.create_connection(("127.0.0.1", port))
        body = json.dumps(QE_BODY).encode()
        gone.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
        gone.sendall(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert qe.entered.wait(timeout=30)
        gone.close()
        time.sleep(0.5)  # the server sees the disconnect
        qe.gate.set()
        assert wait_until(lambda: app.state.reranks.stopped == 1)
        assert qe.calls == 1


def test_beyond_max_reranks_a_reranking_is_503_and_other_requests_are_served(reverse_pytorch):
    qe = GatedQE()
    with serving(reverse_pytorch, ServeLimits(max_reranks=1, request_timeout=0), comet=qe) as (port, _):
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(request, port, "POST", "/translate", QE_BODY)
            assert qe.entered.wait(timeout=30)
            busy = request(port, "POST", "/translate", QE_BODY)
            plain = request(port, "POST", "/translate", {"text": TEXT})
            qe.gate.set()
            assert first.result().status == 200
        assert busy.status == 503 and busy.headers["retry-after"] == "1", busy
        assert "reranks for 1 requests at once (--max-reranks)" in busy.body["detail"]
        assert plain.status == 200
        assert request(port, "POST", "/translate", QE_BODY).status == 200  # its slot is free again
