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

SCORES_FILE = "scores.json"  # a model directory's recorded test/valid scores

if TYPE_CHECKING:
    from sacrebleu.metrics.base import Metric

    from mtkit.config import Config

# Most Multi30k/IWSLT papers report multi-bleu.perl on lowercased, tokenized text.
# sacrebleu's closest protocol is lowercased BLEU with its 13a tokenizer; it is
# reported next to (never instead of) the standard cased BLEU.
LOWERCASED_BLEU = "BLEU (lowercased, tokenized)"


@dataclass
class Score:
    """One corpus-level score and the sacrebleu signature that reproduces it."""

    name: str
    score: float
    signature: str


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
        return "\n".join(f"{s.name:<{width}}  {s.score:6.2f}  signature: {s.signature}" for s in self.scores)


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


def evaluate_model(
    model: Path | list[Path],
    split: str | None = None,
    src: Path | None = None,
    refs: list[Path] | None = None,
    beam: int | None = None,
    output: Path | None = None,
    device: str = "auto",
) -> EvalResult:
    """Translate the recipe's `split` (valid/test) or `src` with a trained run or export (or an
    ensemble of several runs: the first one's recipe), then score it."""
    from mtkit.textio import write_lines
    from mtkit.translate import Translator

    translator = Translator.load(model, device=device)  # a CTranslate2 export carries its recipe too
    first = model[0] if isinstance(model, list) else model
    sources, references = _sources_and_references(translator.config, first, split, src, refs or [])
    hypotheses = translator.translate(sources, beam=beam, progress=True)
    if output is not None:
        write_lines(hypotheses, output)
    result = score_corpus(hypotheses, references)
    if split is not None and src is None and not refs and isinstance(model, Path) and model.is_dir():
        save_scores(model, split, result)
    return result


def save_scores(directory: Path, split: str, result: EvalResult) -> None:
    """Record a split's scores in `directory/scores.json` (what `mtkit serve`'s /info reports)."""
    import json

    from mtkit.translate_file import atomic_output

    known = known_scores(directory) or {}
    known[split] = {score.name: round(score.score, 2) for score in result.scores}
    try:
        with atomic_output(directory / SCORES_FILE) as out:
            out.write(json.dumps(known, indent=1) + "\n")
    except MtkitError:
        pass  # a read-only model directory: the scores are printed all the same


def known_scores(path: Path | str) -> dict | None:
    """The scores `mtkit evaluate -m DIR --split ...` recorded for a model directory, if any."""
    import json

    scores = Path(path) / SCORES_FILE
    try:
        return json.loads(scores.read_text(encoding="utf-8")) if scores.is_file() else None
    except (OSError, ValueError):
        return None


def _sources_and_references(
    config: Config, model: Path, split: str | None, src: Path | None, refs: list[Path]
) -> tuple[list[str], list[list[str]]]:
    if src is not None:
        if not refs:
            raise MtkitError("evaluate --src needs at least one --ref FILE to score against")
        return read_lines(src), [read_lines(ref) for ref in refs]
    if split not in ("valid", "test"):
        raise MtkitError("evaluate -m RUN_DIR needs --split test (or valid), or --src FILE --ref FILE")
    from mtkit.data import iter_split

    split_config = getattr(config.data, split)
    if split_config is None:
        raise MtkitError(f"{model}: the recipe has no data.{split}; use --src FILE --ref FILE instead")
    pairs = list(iter_split(split_config, config.src_lang, config.tgt_lang, config.data.normalize))
    return [s for s, _ in pairs], [[t for _, t in pairs], *[read_lines(ref) for ref in refs]]
