"""The table of metrics, and corpus-level BLEU, chrF and TER from sacrebleu, each reported with sacrebleu's signature.

sacrebleu is imported inside the functions that need it, so importing this module
(and running `mtkit --help`) stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mtkit.errors import MtkitError
from mtkit.textio import read_lines

if TYPE_CHECKING:
    from sacrebleu.metrics.base import Metric

# Most Multi30k/IWSLT papers report multi-bleu.perl on lowercased, tokenized text.
# sacrebleu's closest protocol is lowercased BLEU with its 13a tokenizer; it is
# reported next to (never instead of) the standard cased BLEU.
LOWERCASED_BLEU = "BLEU (lowercased, tokenized)"


@dataclass(frozen=True, kw_only=True)
class MetricRow:
    """One metric, as every part of mtkit names, computes, signs and compares it.

    `key` is how options name it (`--metric`, `train.validate_metric`, `mbr_utility`), `name` how reports,
    scores.json, log lines and paired tests name it. A sacreBLEU metric (`sacrebleu` names its class, built with
    `options`) is computed from corpus statistics and signed with sacreBLEU's signature; a COMET metric is the mean
    of a COMET model's sentence scores, signed with the model's (`mtkit.evaluation.comet`).
    """

    key: str
    name: str
    higher_is_better: bool
    digits: int  # decimals reported: 4 for COMET, whose scores sit near 0-1
    needs_references: bool
    paired: bool  # compared by `evaluate --compare`'s paired tests
    sacrebleu: str | None = None  # BLEU, CHRF or TER; None: a COMET model's sentence scores
    options: tuple[tuple[str, object], ...] = ()  # the sacreBLEU metric's arguments other than its defaults

    def scorer(self) -> Metric:
        """A new sacreBLEU metric object for this row (sacreBLEU's objects keep state, so each use builds one)."""
        import sacrebleu.metrics

        if self.sacrebleu is None:
            raise MtkitError(f"{self.name} is scored by a COMET model, not by sacreBLEU: load one with mtkit.evaluation.comet")
        return getattr(sacrebleu.metrics, self.sacrebleu)(**dict(self.options))


# Every metric mtkit reports, in report order: the sacreBLEU rows are `score_corpus`'s, the COMET rows
# `evaluate --metric`'s. Read by key (`METRICS["bleu"]`) or report name (`metric_named`), never by position.
METRICS: dict[str, MetricRow] = {
    row.key: row
    for row in (
        MetricRow(key="bleu", name="BLEU", higher_is_better=True, digits=2, needs_references=True, paired=True, sacrebleu="BLEU"),
        MetricRow(key="chrf", name="chrF", higher_is_better=True, digits=2, needs_references=True, paired=True, sacrebleu="CHRF"),
        MetricRow(key="ter", name="TER", higher_is_better=False, digits=2, needs_references=True, paired=True, sacrebleu="TER"),
        MetricRow(
            key="bleu_lowercased",
            name=LOWERCASED_BLEU,
            higher_is_better=True,
            digits=2,
            needs_references=True,
            paired=False,
            sacrebleu="BLEU",
            options=(("lowercase", True), ("tokenize", "13a")),
        ),
        MetricRow(key="comet", name="COMET", higher_is_better=True, digits=4, needs_references=True, paired=True),
        MetricRow(key="qe", name="COMET-QE", higher_is_better=True, digits=4, needs_references=False, paired=True),
    )
}


def metric_named(name: str) -> MetricRow:
    """The row of the metric that reports call `name` ("BLEU", "COMET-QE")."""
    for row in METRICS.values():
        if row.name == name:
            return row
    raise MtkitError(f"metric {name!r}: not one mtkit reports; choose one of {', '.join(r.name for r in METRICS.values())}")


def sacrebleu_rows() -> list[MetricRow]:
    """The metrics `score_corpus` reports, computed by sacreBLEU, in report order."""
    return [row for row in METRICS.values() if row.sacrebleu is not None]


@dataclass(kw_only=True)
class Score:
    """One corpus-level score and the sacrebleu signature that reproduces it."""

    name: str
    score: float
    signature: str
    digits: int = 2  # decimals reported: 4 for COMET, whose scores sit near 0-1


@dataclass
class EvalResult:
    """All scores for one hypothesis file against its reference stream(s)."""

    scores: list[Score]
    num_sentences: int

    def to_dict(self) -> dict:
        """JSON-serialisable form: {"num_sentences": n, "scores": {name: {"score", "signature"}}}."""
        return {
            "num_sentences": self.num_sentences,
            "scores": {s.name: {"score": s.score, "signature": s.signature} for s in self.scores},
        }

    def score_of(self, key: str) -> float:
        """The score of the metric whose row in METRICS has `key` ("bleu")."""
        name = METRICS[key].name
        return next(s.score for s in self.scores if s.name == name)

    def format(self) -> str:
        """One line per metric: name, score with two decimals, signature."""
        width = max(len(s.name) for s in self.scores)
        return "\n".join(f"{s.name:<{width}}  {s.score:6.{s.digits}f}  signature: {s.signature}" for s in self.scores)


def score_corpus(hyps: list[str], refs: list[list[str]]) -> EvalResult:
    """Score hypotheses against one or more reference streams.

    Args:
        hyps: one detokenized hypothesis per sentence, length N.
        refs: reference streams, each of length N (refs[k][i] is the k-th reference of sentence i).

    Returns:
        BLEU (cased, 13a), chrF2, TER and lowercased BLEU, each with its sacrebleu signature.
    """
    _check_lengths(hyps, refs)
    scores = []
    for row in sacrebleu_rows():
        metric = row.scorer()
        result = metric.corpus_score(hyps, refs)
        # The signature records the number of references, so it is read after scoring.
        scores.append(Score(name=row.name, score=float(result.score), signature=str(metric.get_signature()), digits=row.digits))
    return EvalResult(scores=scores, num_sentences=len(hyps))


def _check_lengths(hyps: list[str], refs: list[list[str]]) -> None:
    if not hyps:
        raise MtkitError("no hypotheses to score; pass a non-empty hypothesis file")
    if not refs:
        raise MtkitError("no references given; pass at least one reference file")
    for number, stream in enumerate(refs, start=1):
        if len(stream) != len(hyps):
            raise MtkitError(
                f"hypotheses have {len(hyps)} lines but reference {number} has {len(stream)}; "
                "every reference file needs one line per hypothesis"
            )


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU of one reference stream, as `score_corpus` reports it (validation's score)."""
    return float(METRICS["bleu"].scorer().corpus_score(hypotheses, [references]).score)


def chrf(hypotheses: list[str], references: list[str]) -> float:
    """Corpus chrF2 of one reference stream, as `score_corpus` reports it."""
    return float(METRICS["chrf"].scorer().corpus_score(hypotheses, [references]).score)


def evaluate_files(hyp: Path, refs: list[Path]) -> EvalResult:
    """Score a hypothesis file against one or more reference files."""
    return score_corpus(read_lines(hyp), [read_lines(ref) for ref in refs])
