"""The filter rules on synthetic noise mixed into 2,000 Multi30k pairs (`noisy_corpus`): language identification and
dual conditional cross-entropy (from two tiny models trained on the clean pairs) rank the noise below the clean
pairs, with precision and recall printed; `mtkit prepare` counts what each rule dropped and lists the pairs."""

from __future__ import annotations

from pathlib import Path

import yaml
from helpers import cli_output

from mtkit.decoding.translator import Translator
from mtkit.evaluation.filters import DualCrossEntropyFilter, LanguageFilter
from mtkit.evaluation.language import language_identifier

COMET = Path(__file__).resolve().parents[2] / "fixtures" / "comet"
KINDS = ("shuffled", "copy", "wrong_language", "truncated")


def precision_recall(dropped: set[int], noise: set[int]) -> tuple[float, float]:
    return len(dropped & noise) / max(len(dropped), 1), len(dropped & noise) / len(noise)


def recall_by_kind(dropped: set[int], where: dict[str, set[int]]) -> dict[str, float]:
    return {kind: len(dropped & where[kind]) / len(where[kind]) for kind in KINDS}


def test_dual_cross_entropy_ranks_the_noise_below_the_clean_pairs(noisy_corpus):
    pairs, where = noisy_corpus["pairs"], noisy_corpus["where"]
    forward, backward = (Translator.load(noisy_corpus[name], device="cpu") for name in ("forward", "backward"))
    scores = DualCrossEntropyFilter(forward, backward, most=None, share=0.1).scores(pairs)
    noise = set().union(*where.values())
    worst = set(sorted(range(len(pairs)), key=lambda index: -scores[index])[: len(noise)])  # as many as there are noisy
    precision, recall = precision_recall(worst, noise)
    by_kind = recall_by_kind(worst, where)
    print(f"dual cross-entropy, the worst {len(noise)}: precision {precision:.2f}, recall {recall:.2f}, by kind {by_kind}")
    assert precision >= 0.6 and recall >= 0.6
    assert min(by_kind[kind] for kind in ("shuffled", "wrong_language", "copy")) >= 0.5
    clean = [score for index, score in enumerate(scores) if index not in noise]
    assert all(sum(scores[i] for i in where[kind]) / len(where[kind]) > sum(clean) / len(clean) for kind in KINDS)


def test_language_identification_finds_the_wrong_languages_among_the_noise(noisy_corpus):
    pairs, where = noisy_corpus["pairs"], noisy_corpus["where"]
    verdicts = LanguageFilter(language_identifier("data.langid")).drops(pairs, ("de", "en"))
    dropped = {index for index, why in enumerate(verdicts) if why is not None}
    precision = precision_recall(dropped, set().union(*where.values()))[0]  # a truncated target may be no language
    recall = precision_recall(dropped, where["wrong_language"] | where["copy"])[1]
    print(f"language identification: precision {precision:.2f}, recall {recall:.2f}, by kind {recall_by_kind(dropped, where)}")
    assert precision >= 0.95 and recall == 1.0


def test_prepare_counts_each_filter_rule_and_lists_the_pairs_they_dropped(noisy_corpus, tmp_path):
    data = {
        "train": {"src": str(noisy_corpus["src"]), "tgt": str(noisy_corpus["tgt"])},
        "valid": {"src": str(noisy_corpus["src"]), "tgt": str(noisy_corpus["tgt"]), "limit": 20},
        "drop_copies": False,  # the copies are left to the language rule
        "langid": True,
        "dual_xent_forward": str(noisy_corpus["forward"]),
        "dual_xent_backward": str(noisy_corpus["backward"]),
        "dual_xent_drop": 0.05,
        "qe_model": str(COMET / "referenceless"),
        "qe_encoder": str(COMET / "tiny-xlmr"),
        "qe_min": -1e9,  # the tiny random model's scores mean nothing: a threshold below them all keeps every pair
    }
    forward_data = Path(noisy_corpus["forward"]).parent / "data"
    recipe = tmp_path / "recipe.yaml"
    settings = {"name": "filtered", "src_lang": "de", "tgt_lang": "en", "data_dir": str(tmp_path / "data"), "data": data}
    recipe.write_text(yaml.safe_dump(settings), encoding="utf-8")
    (tmp_path / "data").mkdir()
    for piece in forward_data.glob("spm*"):  # the forward model's tokenizer: the data are encoded with it
        (tmp_path / "data" / piece.name).write_bytes(piece.read_bytes())
    said = cli_output("prepare", recipe, "--device", "cpu")
    report = yaml.safe_load((tmp_path / "data" / "prepare_report.json").read_text(encoding="utf-8"))["clean"]
    listed = (tmp_path / "data" / "dropped.tsv").read_text(encoding="utf-8").splitlines()
    judged = report["total"] - sum(report[rule] for rule in ("empty", "too_long", "ratio", "duplicate", "langid"))
    assert report["langid"] >= 100 and report["dual_xent"] == round(0.05 * judged)  # one chunk: the worst 5% of it
    assert report["qe"] == 0 and report["copy"] == 0
    assert report["kept"] == report["total"] - sum(report[rule] for rule in ("empty", "too_long", "ratio", "duplicate", "langid",
                                                                            "dual_xent", "qe"))  # fmt: skip
    assert listed[0] == "corpus\trule\twhy\tsource\ttarget" and len(listed) == 1 + report["langid"] + report["dual_xent"]
    rows = {line.split()[0]: line.split()[1:] for line in said.splitlines() if line.split()}
    assert rows["langid"] == [str(report["langid"])] and rows["dual_xent"] == [str(report["dual_xent"])]
