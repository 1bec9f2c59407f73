"""Paired significance tests: paired bootstrap resampling and approximate randomisation, seeded."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtkit.evaluation.significance import PairedTests, compare_systems
from mtkit.textio import read_lines

SYSTEMS = Path(__file__).resolve().parents[2] / "fixtures" / "systems"


@pytest.mark.slow
def test_a_system_against_itself_is_not_significant_and_a_weaker_one_is(test200):
    references = read_lines(test200[1])
    transformer, rnn = read_lines(SYSTEMS / "demo_transformer.en"), read_lines(SYSTEMS / "rnn_12min.en")
    result = compare_systems(
        ["transformer", "itself", "rnn"],
        [transformer, transformer, rnn],
        references=[references],
        tests=PairedTests(seed=1, bootstrap_samples=200, randomisation_trials=500),
    )
    for metric in ("BLEU", "chrF", "TER"):
        baseline, itself, weaker = result.scores[metric]
        assert baseline.p_bootstrap is None and baseline.p_randomisation is None
        assert itself.p_bootstrap == 1.0 and itself.p_randomisation == 1.0 and itself.score == baseline.score
        assert weaker.p_bootstrap < 0.05 and weaker.p_randomisation < 0.05
        assert abs(baseline.mean - baseline.score) < baseline.ci  # the bootstrap mean lies near the score
    assert result.scores["BLEU"][2].score < result.scores["BLEU"][0].score
    assert result.scores["TER"][2].score > result.scores["TER"][0].score  # TER: lower is better


@pytest.mark.slow
def test_the_same_seed_repeats_a_comparison_exactly(test200):
    references = read_lines(test200[1])
    systems = [read_lines(SYSTEMS / "demo_transformer.en"), read_lines(SYSTEMS / "rnn_12min.en")]
    runs = [
        compare_systems(
            ["a", "b"],
            systems,
            references=[references],
            tests=PairedTests(seed=seed, bootstrap_samples=100, randomisation_trials=100),
        ).to_dict()
        for seed in (3, 3, 4)
    ]
    assert runs[0] == runs[1] and runs[0]["seed"] == 3
    assert runs[0]["scores"]["BLEU"][0]["mean"] != runs[2]["scores"]["BLEU"][0]["mean"]
