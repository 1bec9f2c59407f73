"""Corpus-level BLEU, chrF and TER from sacrebleu, each reported with sacrebleu's signature.

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
# `evaluate --metric`'s neural metrics (mtkit.evaluation.comet), by the names the reports give them.
QUALITY_METRICS = {"comet": "COMET", "qe": "COMET-QE"}


@dataclass
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
    for name, metric in _metrics():
        result = metric.corpus_score(hyps, refs)
        # The signature records the number of references, so it is read after scoring.
        scores.append(Score(name, float(result.score), str(metric.get_signature())))
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
    return float(_metrics()[0][1].corpus_score(hypotheses, [references]).score)


def chrf(hypotheses: list[str], references: list[str]) -> float:
    """Corpus chrF2 of one reference stream, as `score_corpus` reports it."""
    return float(_metrics()[1][1].corpus_score(hypotheses, [references]).score)


def _metrics() -> list[tuple[str, Metric]]:
    """The reported metrics, in report order; sacrebleu defaults unless stated."""
    from sacrebleu.metrics import BLEU, CHRF, TER

    return [
        ("BLEU", BLEU()),
        ("chrF", CHRF()),
        ("TER", TER()),
        (LOWERCASED_BLEU, BLEU(lowercase=True, tokenize="13a")),
    ]


def evaluate_files(hyp: Path, refs: list[Path]) -> EvalResult:
    """Score a hypothesis file against one or more reference files."""
    return score_corpus(read_lines(hyp), [read_lines(ref) for ref in refs])
