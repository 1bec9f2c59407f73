"""`mtkit translate --rerank` end to end on the reverse-task model: one line per input, each the candidate that
the tiny COMET-QE checkpoint (tests/fixtures/comet/) or minimum Bayes risk chooses among the beam's n-best or
the samples."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from helpers import cli_output, invoke, stdout_lines, succeeded, write_text_lines

from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.comet.scorer import CometScorer
from mtkit.evaluation.rerank import Reranker, RerankOptions

COMET = Path(__file__).resolve().parents[2] / "fixtures" / "comet"
QE_FLAGS = ["--comet-model", COMET / "referenceless", "--comet-encoder", COMET / "tiny-xlmr", "--device", "cpu"]


@pytest.fixture(scope="module")
def sources(reverse_run, tmp_path_factory) -> tuple[Path, list[str]]:
    raw = reverse_run.data_path.parent / "raw"
    lines = [*(raw / "valid.src").read_text().splitlines()[:6], ""]  # an empty line stays an empty line
    return write_text_lines(tmp_path_factory.mktemp("rerank") / "in.txt", lines), lines


def nbest_lists(run: Path, path: Path, *flags: object) -> list[list[str]]:
    """Each line's candidates as `--nbest` prints them (text, score, text, score, ...)."""
    return [line.split("\t")[::2] for line in cli_output("translate", "-m", run, "-i", path, *flags).splitlines()]


def test_qe_reranking_prints_the_candidate_the_qe_model_scores_highest(reverse_run, sources):
    path, lines = sources
    result = succeeded(invoke("translate", "-m", reverse_run.run_path, "-i", path, "--beam", 4, "--rerank", "qe",
                              "--candidates", 4, *QE_FLAGS))  # fmt: skip
    chosen = stdout_lines(result)
    assert len(chosen) == len(lines) and chosen[-1] == ""
    scorer = CometScorer.load(CometOptions(model=str(COMET / "referenceless"), encoder=COMET / "tiny-xlmr", device="cpu"))
    for source, line, picked in zip(lines, nbest_lists(reverse_run.run_path, path, "--beam", 4, "--nbest", 4), chosen,
                                    strict=True):  # fmt: skip
        texts = list(dict.fromkeys(line))
        scores = scorer.score([source] * len(texts), texts) if len(texts) > 1 else [0.0]
        assert picked == texts[scores.index(max(scores))]


def test_mbr_reranking_of_a_beam_prints_its_consensus_candidate(reverse_run, sources):
    path, lines = sources
    chosen = cli_output("translate", "-m", reverse_run.run_path, "-i", path, "--beam", 4, "--rerank", "mbr", "--candidates", 4)
    mbr = Reranker(RerankOptions(method="mbr", candidates=4))
    expected = []
    for source, line in zip(lines, nbest_lists(reverse_run.run_path, path, "--beam", 4, "--nbest", 4), strict=True):
        values = mbr.mbr_values([source], [Counter(line)])[0]
        expected.append(list(dict.fromkeys(line))[values.index(max(values))])
    assert chosen.splitlines() == expected


def test_mbr_over_samples_prints_one_of_the_samples(reverse_run, sources):
    path, lines = sources
    flags = ["--sampling", "topk:5", "--seed", 3]
    samples = nbest_lists(reverse_run.run_path, path, *flags, "--nbest", 5)
    chosen = cli_output("translate", "-m", reverse_run.run_path, "-i", path, *flags, "--rerank", "mbr", "--candidates", 5)
    assert len(chosen.splitlines()) == len(lines)
    assert all(picked in line for picked, line in zip(chosen.splitlines(), samples, strict=True))


def test_more_candidates_than_the_beam_is_one_line(reverse_run, sources):
    result = invoke("translate", "-m", reverse_run.run_path, "-i", sources[0], "--beam", 2, "--rerank", "mbr", "--candidates", 4)
    assert result.exit_code == 2
    assert result.stderr == (
        "mtkit: error: --candidates 4 with a beam of 2: a beam search finds at most its size; give --beam 4 or more, "
        "or draw them with --sampling\n"
    )
