"""Choosing among candidates: MBR picks the consensus of hand-made candidate lists, QE picks the tiny COMET-QE
checkpoint's best, and every mistake in the options is one line (through `mtkit translate` too)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import invoke

from mtkit.decoding.options import Decoding, Sampling
from mtkit.decoding.translator import Translation
from mtkit.errors import MtkitError, OptionError
from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.rerank import COMET_WORK, Reranker, RerankOptions, RerankStopped, expected_utilities, mbr_pairs

COMET = Path(__file__).resolve().parents[1] / "fixtures" / "comet"


def candidates(*texts: str) -> list[Translation]:
    """A search's candidates, best model score first."""
    return [Translation(text=text, score=-float(rank), tokens=[]) for rank, text in enumerate(texts)]


def chosen(reranker: Reranker, source: str, *texts: str) -> str:
    return reranker.choose([source], [candidates(*texts)])[0][0].text


MBR = Reranker(RerankOptions(method="mbr", candidates=4))


def test_mbr_picks_the_candidate_the_others_agree_with_over_the_search_best_outlier():
    texts = ("zebras juggle quartz", "a man rides a red bike", "a man rides a bike", "a man on a red bike")
    assert chosen(MBR, "ein Mann fährt ein rotes Fahrrad", *texts) == "a man rides a red bike"


def test_mbr_keeps_the_search_order_of_the_others_after_the_chosen_one():
    texts = ["x y z", "a dog runs", "a dog runs fast", "a dog is running"]
    line = MBR.choose(["s"], [candidates(*texts)])[0]
    assert line[0].text != "x y z" and [t.text for t in line[1:]] == [text for text in texts if text != line[0].text]
    assert [t.score for t in line[1:]] == sorted((t.score for t in line[1:]), reverse=True)


def test_a_candidate_found_twice_is_counted_twice():
    # alone, "the cat sat" and "a dog ran" are as far apart as can be; a second copy of the second decides
    assert chosen(MBR, "s", "the cat sat", "a dog ran", "a dog ran") == "a dog ran"
    assert chosen(MBR, "s", "the cat sat", "the cat sat", "a dog ran") == "the cat sat"


def test_ties_go_to_the_candidate_the_search_ranked_first():
    assert chosen(MBR, "s", "alpha", "omega") == "alpha"
    assert chosen(MBR, "s", "omega", "alpha") == "omega"


def test_one_candidate_or_an_empty_line_is_left_as_it_is():
    assert MBR.choose(["", "s"], [candidates(""), candidates("only one")]) == [candidates(""), candidates("only one")]


def test_expected_utility_is_the_mean_over_the_other_candidates_counted_as_found():
    counts = [2, 1]  # candidate 0 found twice: its own copy is one of the others
    assert mbr_pairs(counts) == [(0, 0), (0, 1), (1, 0)]
    utility = {(0, 0): 100.0, (0, 1): 40.0, (1, 0): 10.0}
    assert expected_utilities(counts, utility) == [(100.0 + 40.0) / 2, (10.0 + 10.0) / 2]
    assert expected_utilities([1], {}) == [0.0]


def qe_options(model: str = "referenceless", **changes: object) -> RerankOptions:
    comet = CometOptions(model=str(COMET / model), encoder=COMET / "tiny-xlmr", device="cpu")
    return RerankOptions(**{"method": "qe", "candidates": 3, "comet": comet, **changes})


def test_qe_picks_the_candidate_the_reference_free_model_scores_highest():
    reranker = Reranker.load(qe_options())
    assert reranker is not None and reranker.scorer is not None
    sources = ["Ein Hund läuft.", "Zwei Kinder spielen."]
    lines = [candidates("A dog runs.", "A dog is running.", "Dog."), candidates("Two kids play.", "Kids", "Two children play.")]
    for source, line, picked in zip(sources, lines, reranker.choose(sources, lines), strict=True):
        scores = reranker.scorer.score([source] * len(line), [t.text for t in line])
        assert picked[0].text == line[scores.index(max(scores))].text
        assert sorted(t.text for t in picked) == sorted(t.text for t in line)


@pytest.mark.parametrize(
    ("options", "nbest", "said"),
    [
        (RerankOptions(method="mbr"), 1, "--rerank mbr chooses among candidates: give --candidates N of 2 or more"),
        (RerankOptions(method="qe", candidates=1), 1, "--candidates N of 2 or more, such as --candidates 8 (not 1)"),
        (RerankOptions(method="mbr", candidates=4), 3, "--nbest 3 with --rerank: reranking returns one translation"),
        (RerankOptions(method="qe", candidates=4), 1, "--rerank qe needs --comet-model M, a reference-free COMET model"),
        (RerankOptions(method="mbr", candidates=4, utility="comet"), 1, "--mbr-utility comet needs --comet-model M"),
        (RerankOptions(candidates=4), 1, "--candidates 4 without --rerank"),
        (RerankOptions(utility="chrf"), 1, "--mbr-utility chrf without --rerank"),
        (qe_options(utility="chrf"), 1, "--mbr-utility is the utility of --rerank mbr: with --rerank qe leave it out"),
        (qe_options(method="mbr"), 1, "--comet-model with --rerank mbr: chrF needs no model; add --mbr-utility comet"),
    ],
)
def test_options_that_cannot_rerank_are_one_line_each(options, nbest, said):
    with pytest.raises(OptionError, match=re.escape(said)):
        Reranker.load(options, nbest=nbest)


def test_a_model_of_the_wrong_kind_is_one_line():
    with pytest.raises(MtkitError, match="scores against references; --rerank qe needs a reference-free"):
        Reranker.load(qe_options("regression"))
    with pytest.raises(MtkitError, match=r"is reference-free \(QE\); --mbr-utility comet needs a reference-based"):
        Reranker.load(qe_options(method="mbr", utility="comet"))


def test_a_beam_gives_at_most_its_size_and_sampling_draws_any_number():
    translator = SimpleNamespace(decode=SimpleNamespace(beam=4))
    MBR.check(translator, Decoding())  # the recipe's beam of 4: four candidates
    with pytest.raises(OptionError, match="^--candidates 4 with a beam of 2: .* give --beam 4 or more, or draw"):
        MBR.check(translator, Decoding(beam=2))
    MBR.check(translator, Decoding(sampling=Sampling(top_k=5)))


def test_translate_refuses_a_reranking_it_cannot_do_in_one_line_before_loading_the_model(tmp_path):
    missing = tmp_path / "no-such-run"
    for flags, said in [
        (["--rerank", "qe", "--candidates", "4"], "--rerank qe needs --comet-model M"),
        (["--rerank", "mbr"], "--rerank mbr chooses among candidates"),
        (["--candidates", "4"], "--candidates 4 without --rerank"),
        (["--rerank", "qe", "--candidates", "4", "--comet-model", COMET / "regression", "--comet-encoder", COMET / "tiny-xlmr"],
         "scores against references; --rerank qe needs a reference-free (QE) model"),
    ]:  # fmt: skip
        result = invoke("translate", "-m", missing, *flags, input="a b c\n")
        assert result.exit_code == 2 and result.stderr.startswith("mtkit: error: ") and said in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1


class CountingComet:
    """A COMET model's stand-in that scores one sentence a call (batch_size 1), by length, and counts its calls."""

    def __init__(self, *, needs_references: bool) -> None:
        self.options, self.needs_references, self.calls = CometOptions(model="counting", batch_size=1), needs_references, 0

    def score(self, sources: list[str], translations: list[str], references: list[str] | None = None) -> list[float]:
        self.calls += 1
        return [float(len(text)) for text in translations]


@pytest.mark.parametrize("counts", [[1] * 8, [8], [3, 3, 2], [2, 1, 1, 1, 1, 1, 1], [4, 4]])
def test_a_rerankings_work_counts_the_most_scorings_its_candidates_can_take(counts):
    n = sum(counts)
    assert len(mbr_pairs(counts)) <= n * (n - 1) == Reranker(RerankOptions(method="mbr", candidates=n)).scorings()
    assert Reranker(RerankOptions(method="mbr", candidates=64)).work(33) == 33 * 64 * 63  # chrF: one unit a scoring
    qe = Reranker(RerankOptions(method="qe", candidates=8), CountingComet(needs_references=False))
    assert qe.work(5) == 5 * 8 * COMET_WORK
    assert qe.describe_work(5) == f"{5 * 8 * COMET_WORK} of reranking (5 sentences x 8 COMET scorings of {COMET_WORK})"


@pytest.mark.parametrize(("method", "utility"), [("qe", None), ("mbr", "comet")])
def test_a_reranking_stops_between_chunks_once_told(method, utility):
    comet = CountingComet(needs_references=method == "mbr")
    reranker = Reranker(RerankOptions(method=method, candidates=4, utility=utility), comet)
    lines = [candidates("a b", "a c", "b c", "c d")] * 3
    with pytest.raises(RerankStopped):
        reranker.choose(["s"] * 3, lines, stop=lambda: comet.calls >= 2)
    assert comet.calls == 2
    assert reranker.choose(["s"] * 3, lines, stop=lambda: False) == reranker.choose(["s"] * 3, lines)  # chunks alike


def test_an_mbr_by_chrf_stops_between_chunks_once_told():
    with pytest.raises(RerankStopped):
        MBR.choose(["s"], [candidates("a b", "a c", "b c", "c d")], stop=lambda: True)
