"""POST /translate with `rerank`: each sentence's translation chosen among its candidates by the server's COMET-QE
model (the tiny checkpoint of tests/fixtures/comet/) or by minimum Bayes risk, and a bad reranking a 400 in one line."""

from __future__ import annotations

from collections import Counter
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
