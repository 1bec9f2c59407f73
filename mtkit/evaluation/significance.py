"""Is system B really better than A? Paired significance tests of several systems against the first.

Every system is compared with the first (the baseline) on the same references by sacreBLEU's own
paired bootstrap resampling (which also gives each system's mean and 95% confidence interval) and
paired approximate randomisation, for BLEU, chrF and TER; a COMET score, the mean of its sentence scores, by
the same two tests over those scores (`compare_sentence_scores`). The seed and the sample counts are part
of the result, so a comparison can be repeated exactly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from mtkit.errors import MtkitError
from mtkit.evaluation.metrics import METRICS, metric_named


@dataclass(kw_only=True)
class SystemScore:
    """One system's score on one metric; `mean` and `ci` (the 95% half-width) from bootstrap resampling;
    p-values (bootstrap, approximate randomisation) against the baseline, None for the baseline itself."""

    score: float
    mean: float
    ci: float
    p_bootstrap: float | None
    p_randomisation: float | None


@dataclass(frozen=True, kw_only=True)
class PairedTests:
    """How systems are compared, every default stated once (the CLI reads them here): the seed and the
    sample counts, reported with the results."""

    seed: int = 12345
    bootstrap_samples: int = 1000  # paired bootstrap resamples
    randomisation_trials: int = 10000  # paired approximate randomisation trials


@dataclass(kw_only=True)
class Comparison:
    systems: list[str]
    scores: dict[str, list[SystemScore]]  # metric -> one per system, in order
    seed: int
    bootstrap_samples: int
    randomisation_trials: int

    def to_dict(self) -> dict:
        return asdict(self)

    def format(self, alpha: float = 0.05) -> str:
        """A table per metric: score, mean ± 95% CI, and both p-values, * marking p < alpha."""
        quality = {name for name in self.scores if metric_named(name).sacrebleu is None}
        kinds = (["sacreBLEU"] if set(self.scores) - quality else []) + (["COMET's over its sentence scores"] if quality else [])
        lines = [
            f"paired tests against {self.systems[0]} ({', '.join(kinds)}; bootstrap: {self.bootstrap_samples} resamples, "
            f"approximate randomisation: {self.randomisation_trials} trials, seed {self.seed})"
        ]
        width = max(len(name) for name in self.systems)
        for metric, scores in self.scores.items():
            digits = metric_named(metric).digits
            lines.append(f"{metric:<{width}}  score   mean ± 95% CI     p (bootstrap)  p (randomisation)")
            for name, result in zip(self.systems, scores, strict=True):
                p_values = "  baseline" if result.p_bootstrap is None else _p_values(result, alpha)
                numbers = f"{result.score:6.{digits}f}  {result.mean:6.{digits}f} ± {result.ci:5.{digits}f}"
                lines.append(f"{name:<{width}}  {numbers}   {p_values}")
        return "\n".join(lines)


def compare_systems(
    names: Sequence[str],
    hypotheses: Sequence[Sequence[str]],
    *,
    references: Sequence[Sequence[str]],
    tests: PairedTests = PairedTests(),
) -> Comparison:
    """Compare each system with the first; every hypothesis list and reference stream is aligned."""
    from sacrebleu.significance import PairedTest

    if len(hypotheses) < 2:
        raise MtkitError("a comparison needs at least two systems: give --hyp A --hyp B (or -m A -m B --compare)")
    for name, hyps in zip(names, hypotheses, strict=True):
        for stream in references:
            if len(hyps) != len(stream):
                raise MtkitError(f"{name} has {len(hyps)} lines but a reference has {len(stream)}; give aligned files")
    systems = list(zip(names, [list(h) for h in hypotheses], strict=True))
    paired = [row for row in METRICS.values() if row.paired and row.sacrebleu is not None]
    results = {}
    with _seed(tests.seed):
        for test, samples in (("bs", tests.bootstrap_samples), ("ar", tests.randomisation_trials)):
            metrics = {row.name: row.scorer() for row in paired}
            _, found = PairedTest(systems, metrics, [list(r) for r in references], test, samples, -1)()
            # sacreBLEU renames each metric (chrF -> chrF2) and keeps the order it was given, so its results are
            # matched to the rows in that order
            renamed = [key for key in found if key != "System"]
            results[test] = dict(zip(metrics, (found[key] for key in renamed), strict=True))
    scores = {
        metric: [
            _system_score(bs.score, bs.mean, bs.ci, _p_values_against(bs_results[0].score, bs, ar) if n else (None, None))
            for n, (bs, ar) in enumerate(zip(bs_results, ar_results, strict=True))
        ]
        for metric, bs_results, ar_results in ((name, results["bs"][name], results["ar"][name]) for name in results["bs"])
    }
    return Comparison(
        systems=list(names),
        scores=scores,
        seed=tests.seed,
        bootstrap_samples=tests.bootstrap_samples,
        randomisation_trials=tests.randomisation_trials,
    )


def compare_sentence_scores(scores: Sequence[Sequence[float]], tests: PairedTests = PairedTests()) -> list[SystemScore]:
    """The same two paired tests for a metric whose corpus score is the mean of its sentence scores (COMET):
    each system against the first, resampling or swapping sentence scores where sacreBLEU resamples statistics.

    Args:
        scores: one list of N sentence scores per system, the baseline first, aligned sentence by sentence.
    """
    import numpy as np
    from sacrebleu.significance import estimate_ci

    table = np.asarray(scores, dtype=np.float64)  # (systems, N)
    draws = np.random.default_rng(tests.seed).choice(table.shape[1], size=(tests.bootstrap_samples, table.shape[1]))
    resampled = [system[draws].mean(axis=1) for system in table]  # per system: (samples,)
    found = []
    for number, system in enumerate(table):
        mean, ci = estimate_ci(resampled[number])
        p_values: tuple[float | None, float | None] = (None, None)
        if number:
            observed = abs(system.mean() - table[0].mean())
            deltas = np.abs(resampled[number] - resampled[0])
            swapped = _swapped_differences(table[0] - system, tests)
            p_values = (1.0, 1.0) if observed == 0 else (_p_value(deltas - deltas.mean(), observed), _p_value(swapped, observed))
        found.append(_system_score(system.mean(), mean, ci, p_values))
    return found


def _system_score(score: Any, mean: Any, ci: Any, p_values: tuple[float | None, float | None]) -> SystemScore:
    """A row of the comparison, as plain floats; p-values (bootstrap, randomisation) None for the baseline."""
    p_bootstrap, p_randomisation = p_values
    return SystemScore(
        score=float(score), mean=float(mean), ci=float(ci), p_bootstrap=p_bootstrap, p_randomisation=p_randomisation
    )


def _swapped_differences(differences: Any, tests: PairedTests) -> Any:
    """|mean(A) - mean(B)| after swapping each sentence's two scores with probability 1/2, once a trial."""
    import numpy as np

    rng = np.random.default_rng(tests.seed)
    found = []
    for start in range(0, tests.randomisation_trials, 1000):  # 1000 trials at a time bound the memory
        signs = rng.integers(2, size=(min(1000, tests.randomisation_trials - start), len(differences))) * 2 - 1
        found.append(np.abs(signs @ differences) / len(differences))
    return np.concatenate(found)


def _p_value(samples: Any, observed: float) -> float:
    """sacreBLEU's p-value: the share of sampled statistics above the observed one, with add-one smoothing."""
    return (int((samples > observed).sum()) + 1) / (len(samples) + 1)


def _p_values_against(baseline: float, bootstrap: Any, randomisation: Any) -> tuple[float, float]:
    """sacreBLEU's p-values, except p = 1 where the scores are equal: sacreBLEU counts only sampled
    differences strictly above the observed one, so a zero difference (a system against itself)
    would come out as p = 1 / (samples + 1), "significant"; no test can reject "no difference" there."""
    if bootstrap.score == baseline:
        return 1.0, 1.0
    return float(bootstrap.p_value), float(randomisation.p_value)


def _p_values(result: SystemScore, alpha: float) -> str:
    marks = ["*" if p is not None and p < alpha else " " for p in (result.p_bootstrap, result.p_randomisation)]
    return f"{result.p_bootstrap:8.4f}{marks[0]}      {result.p_randomisation:8.4f}{marks[1]}"


@contextmanager
def _seed(seed: int):  # noqa: ANN202 - a context manager
    """sacreBLEU's paired tests read their seed from SACREBLEU_SEED."""
    previous = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("SACREBLEU_SEED", None)
        else:
            os.environ["SACREBLEU_SEED"] = previous
