"""The filter rules of `mtkit prepare` on synthetic noise mixed into a Multi30k slice: language identification,
dual conditional cross-entropy (here from stub models with hand-written log-probabilities), the COMET-QE threshold
with the tiny checkpoint; the cleaning report counts each rule, and every mistake is one line."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from helpers import noisy_multi30k

from mtkit.config import Config, DataConfig, config_from_dict
from mtkit.data.corpora import Cleaner, CleanReport, DroppedPair, clean_table
from mtkit.decoding.pair_scores import PairScore
from mtkit.errors import MtkitError
from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.comet.scorer import CometScorer
from mtkit.evaluation.filters import (
    DualCrossEntropyFilter,
    LanguageFilter,
    QualityFilter,
    corpus_filters,
    dual_cross_entropy,
)
from mtkit.evaluation.language import language_identifier

COMET = Path(__file__).resolve().parents[1] / "fixtures" / "comet"
DE_EN = ("de", "en")


@pytest.fixture(scope="module")
def identifier() -> object:
    return language_identifier("data.langid")


@pytest.fixture(scope="module")
def noisy() -> tuple[list[tuple[str, str]], dict[str, set[int]]]:
    return noisy_multi30k(400, 20)


def dropped_indices(verdicts: list[str | None]) -> set[int]:
    return {index for index, why in enumerate(verdicts) if why is not None}


def test_language_identification_drops_wrong_languages_and_copies_and_keeps_the_clean_pairs(noisy, identifier):
    pairs, where = noisy
    verdicts = LanguageFilter(identifier).drops(pairs, DE_EN)
    dropped = dropped_indices(verdicts)
    assert where["wrong_language"] <= dropped and where["copy"] <= dropped  # a German target is not English
    clean = set(range(len(pairs))) - set().union(*where.values())
    assert len(dropped & clean) <= 2  # precision: py3langid is sure of Multi30k's captions
    assert all(verdicts[i] == "target fr" for i in where["wrong_language"])


def test_each_identifier_narrows_its_own_languages_of_a_model_read_once():
    first, second = language_identifier("data.langid"), language_identifier("--off-target")
    assert first.tk_nextmove is second.tk_nextmove  # one model in the process
    everything = len(second.nb_classes)
    first.set_languages(["de", "en"])
    assert sorted(first.nb_classes) == ["de", "en"] and first.nb_ptc.shape[1] == 2
    assert len(second.nb_classes) == second.nb_ptc.shape[1] == everything > 90
    assert second.classify("Ein kleiner Hund rennt über eine grüne Wiese.")[0] == "de"
    assert len(language_identifier("data.langid").nb_classes) == everything


def test_the_cleaning_report_counts_each_rule_and_lists_what_the_filters_dropped(noisy, identifier):
    pairs, where = noisy
    cleaner = Cleaner(DataConfig(), [LanguageFilter(identifier)])
    report, dropped = CleanReport(), []
    kept = cleaner.clean(pairs, report, languages=DE_EN, dropped=dropped, corpus="crawl")
    assert report.copy == len(where["copy"])  # counted under the first rule they break, before any model reads them
    assert report.filters["langid"] == len(dropped) >= len(where["wrong_language"])
    assert report.total == len(pairs) == report.kept + report.ratio + report.copy + report.filters["langid"]
    assert len(kept) == report.kept
    assert {pairs[i] for i in where["wrong_language"]} <= {d.pair for d in dropped}
    assert dropped[0].line().split("\t")[:3] == ["crawl", "langid", dropped[0].why]
    assert report.to_dict()["langid"] == report.filters["langid"]
    assert CleanReport.from_dict(report.to_dict()) == report


def test_the_cleaning_table_has_a_row_for_each_filter_a_corpus_ran():
    news = CleanReport(total=10, kept=7, filters={"langid": 2, "qe": 1}).to_dict()
    crawl = CleanReport(total=5, kept=5).to_dict()
    rows = [line.split() for line in clean_table({"news": news, "crawl": crawl}).splitlines()]
    assert rows[6:10] == [["langid", "2", "0", "2"], ["qe", "1", "0", "1"], ["kept", "7", "5", "12"], ["total", "10", "5", "15"]]


class StubModel:
    """A translator whose `score` gives each (source, target) the per-token log-probability written in `table`."""

    def __init__(self, table: dict[tuple[str, str], float]) -> None:
        self.table = table

    def score(self, sources: list[str], targets: list[str]) -> list[PairScore]:
        return [PairScore(log_prob=self.table[(s, t)] * 4, tokens=4) for s, t in zip(sources, targets, strict=True)]


PAIRS = [("ein Hund", "a dog"), ("eine Katze", "a cat"), ("ein Haus", "zebra"), ("ein Baum", "a tree")]
FORWARD = StubModel({PAIRS[0]: -1.0, PAIRS[1]: -1.5, PAIRS[2]: -4.0, PAIRS[3]: -1.0})
BACKWARD = StubModel(
    {(t, s): value for (s, t), value in {PAIRS[0]: -1.0, PAIRS[1]: -1.0, PAIRS[2]: -2.0, PAIRS[3]: -3.0}.items()}
)


def test_dual_cross_entropy_adds_the_models_disagreement_to_their_mean():
    assert dual_cross_entropy(1.0, 1.0) == 1.0
    assert dual_cross_entropy(1.0, 3.0) == dual_cross_entropy(3.0, 1.0) == 2.0 + 2.0
    rule = DualCrossEntropyFilter(FORWARD, BACKWARD, most=10.0, share=None)
    assert rule.scores(PAIRS) == [1.0, 0.5 + 1.25, 2.0 + 3.0, 2.0 + 2.0]


def test_dual_cross_entropy_drops_above_its_threshold_or_the_worst_share():
    above = DualCrossEntropyFilter(FORWARD, BACKWARD, most=3.0, share=None).drops(PAIRS, DE_EN)
    assert above == [None, None, "5.0000", "4.0000"]
    worst = DualCrossEntropyFilter(FORWARD, BACKWARD, most=None, share=0.25).drops(PAIRS, DE_EN)
    assert worst == [None, None, "5.0000", None]


def test_the_qe_rule_drops_the_pairs_the_model_scores_below_its_threshold(noisy):
    pairs = noisy[0][:12]
    scorer = CometScorer.load(CometOptions(model=str(COMET / "referenceless"), encoder=COMET / "tiny-xlmr", device="cpu"))
    scores = scorer.score([s for s, _ in pairs], [t for _, t in pairs])
    threshold = sorted(scores)[len(scores) // 2]
    verdicts = QualityFilter(scorer, threshold).drops(pairs, DE_EN)
    assert dropped_indices(verdicts) == {index for index, score in enumerate(scores) if score < threshold}
    assert len(dropped_indices(verdicts)) == len(scores) // 2


def recipe_config(tmp_path: Path, src_lang: str = "de", tgt_lang: str = "en", **data: object) -> Config:
    files = {"src": str(tmp_path / "x.src"), "tgt": str(tmp_path / "x.tgt")}
    return config_from_dict({"name": "filters", "src_lang": src_lang, "tgt_lang": tgt_lang, "data_dir": str(tmp_path),
                             "data": {"train": files, "valid": files, **data}})  # fmt: skip


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ({"dual_xent_max": 3.0}, "'data.dual_xent_max' is 3.0; it needs data.dual_xent_forward and data.dual_xent_backward"),
        ({"dual_xent_forward": "runs/a"}, "the rule reads a model of each direction: set data.dual_xent_backward too"),
        ({"dual_xent_forward": "a", "dual_xent_backward": "b"}, "set one of data.dual_xent_max (a score, such as 3.0) or"),
        ({"dual_xent_forward": "a", "dual_xent_backward": "b", "dual_xent_max": 2.0, "dual_xent_drop": 0.1}, "set one of"),
        ({"dual_xent_forward": "a", "dual_xent_backward": "b", "dual_xent_drop": 1.5}, "'data.dual_xent_drop' is 1.5; give"),
        ({"qe_min": 0.5}, "'data.qe_min' is 0.5; it needs data.qe_model: a reference-free COMET folder or hub id"),
        ({"qe_model": "m"}, "'data.qe_model' is 'm'; set data.qe_min too"),
        ({"langid": "maybe"}, "data.langid"),
    ],
)
def test_filter_keys_that_do_not_go_together_are_one_line(tmp_path, keys, said):
    with pytest.raises(MtkitError, match=re.escape(said)) as raised:
        recipe_config(tmp_path, **keys)
    assert "\n" not in str(raised.value)


def test_filters_that_cannot_run_are_one_line_before_any_pair_is_read(tmp_path, monkeypatch):
    with pytest.raises(MtkitError, match="data.langid: py3langid does not identify language 'src'"):
        corpus_filters(recipe_config(tmp_path, "src", "tgt", langid=True))
    reference_based = {"qe_model": str(COMET / "regression"), "qe_encoder": str(COMET / "tiny-xlmr"), "qe_min": 0.1}
    with pytest.raises(MtkitError, match="data.qe_model: .* scores against references, which training pairs lack"):
        corpus_filters(recipe_config(tmp_path, **reference_based), device="cpu")
    with pytest.raises(MtkitError, match=r"^data.qe_model \S+nowhere: no such folder"):
        corpus_filters(recipe_config(tmp_path, qe_model=str(tmp_path / "nowhere"), qe_min=0.1))
    monkeypatch.setitem(sys.modules, "py3langid.langid", None)  # the extra not installed
    with pytest.raises(MtkitError, match=r"^data.langid needs the language identifier py3langid: pip install 'mtkit\[langid\]'"):
        corpus_filters(recipe_config(tmp_path, langid=True))


def test_no_filter_is_built_when_the_recipe_sets_none(tmp_path):
    assert corpus_filters(recipe_config(tmp_path)) == []
    assert isinstance(DroppedPair(corpus="c", rule="qe", why="0.1", pair=("a", "b")).line(), str)
