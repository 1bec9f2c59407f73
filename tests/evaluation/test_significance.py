"""compare_sentence_scores: the paired tests over sentence scores (COMET's), against known cases."""

from __future__ import annotations

import random

from mtkit.evaluation.significance import PairedTests, compare_sentence_scores

TESTS = PairedTests(seed=3, bootstrap_samples=500, randomisation_trials=2000)


def noisy(count: int, shift: float, seed: int) -> list[float]:
    draw = random.Random(seed)
    return [0.5 + shift + draw.gauss(0, 0.1) for _ in range(count)]


def test_a_clearly_better_system_is_significant_and_itself_is_not():
    baseline = noisy(200, 0.0, 1)
    better = [score + 0.05 for score in baseline]
    first, same, other = compare_sentence_scores([baseline, baseline, better], TESTS)
    assert first.p_bootstrap is None and first.p_randomisation is None
    assert (same.p_bootstrap, same.p_randomisation) == (1.0, 1.0)
    assert other.p_bootstrap < 0.01 and other.p_randomisation < 0.01
    assert abs(other.score - first.score - 0.05) < 1e-9
    assert abs(other.mean - other.score) < 0.01 and 0 < other.ci < 0.05


def test_noise_alone_is_not_significant_and_the_seed_repeats_it():
    baseline, other = noisy(200, 0.0, 1), noisy(200, 0.0, 2)
    found = compare_sentence_scores([baseline, other], TESTS)
    assert found[1].p_bootstrap > 0.05 and found[1].p_randomisation > 0.05
    assert compare_sentence_scores([baseline, other], TESTS) == found
