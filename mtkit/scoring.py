"""`mtkit score`: the model's log-probability of given translations (filtering, reranking, QE).

Each pair is scored teacher-forced: the sum of the log-probabilities of the target's pieces and
its final EOS given the source, read the way the model reads text (normalised, SentencePiece).
Pairs are sorted into length batches of `decode.batch_tokens` and put back in input order; files
stream in windows, and the output file is replaced only once complete. A pair longer than the
model's positions is scored on its first pieces, and counted in a warning.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

from tqdm import tqdm

from mtkit.engine import Capability
from mtkit.errors import MtkitError
from mtkit.textio import count_lines, file_lines, model_text
from mtkit.translate import Translator, length_batches

WINDOW_PAIRS = 10_000


@dataclass
class PairScore:
    """A pair's total log-probability (natural log, EOS included) and its number of target tokens."""

    log_prob: float
    tokens: int  # target pieces + EOS
    truncated: bool = False

    @property
    def average(self) -> float:
        return self.log_prob / self.tokens

    def line(self) -> str:
        """`total<TAB>average<TAB>tokens`, the plain output line."""
        return f"{self.log_prob:.4f}\t{self.average:.4f}\t{self.tokens}"

    def json(self) -> str:
        return json.dumps({**asdict(self), "average": round(self.average, 6)})


def score_pairs(translator: Translator, sources: Sequence[str], targets: Sequence[str]) -> list[PairScore]:
    """The score of each (source, target) pair, in input order."""
    translator.require(Capability.SCORE, "mtkit score")
    if len(sources) != len(targets):
        raise MtkitError(f"{len(sources)} sources but {len(targets)} targets: give one target per source")
    limit = translator.engine.max_positions - 1  # room for EOS (source) or BOS (target)
    source_ids = [translator.tokenizers.src.encode(model_text(s, translator.normalize)) for s in sources]
    target_ids = [translator.tokenizers.tgt.encode(model_text(t, translator.normalize)) for t in targets]
    truncated = [len(s) > limit or len(t) > limit for s, t in zip(source_ids, target_ids, strict=True)]
    source_ids, target_ids = [s[:limit] for s in source_ids], [t[:limit] for t in target_ids]
    scores: list[PairScore | None] = [None] * len(sources)
    lengths = [max(len(s), len(t)) for s, t in zip(source_ids, target_ids, strict=True)]
    for batch in length_batches(lengths, 1, translator.decode.batch_tokens):
        found = translator.engine.score([source_ids[i] for i in batch], [target_ids[i] for i in batch])
        for index, log_probs in zip(batch, found, strict=True):
            scores[index] = PairScore(sum(log_probs), len(log_probs), truncated[index])
    return [score for score in scores if score is not None]


def score_files(translator: Translator, src: Path, tgt: Path, output: Path | None, as_json: bool = False) -> list[int]:
    """Write one score line per pair of `src` and `tgt` lines into `output` (stdout when None).

    Returns the line numbers (1-based) of pairs scored on their first pieces only.
    """
    from mtkit.translate_file import atomic_output

    for path in (src, tgt):
        if not path.is_file():
            raise MtkitError(f"{path}: no such file; give a text file with one sentence per line")
    counts = [count_lines(path) for path in (src, tgt)]
    if counts[0] != counts[1]:
        raise MtkitError(f"{src} has {counts[0]} lines but {tgt} has {counts[1]}: give one target line per source line")
    translator.require(Capability.SCORE, "mtkit score")
    pairs = zip(file_lines(src), file_lines(tgt), strict=True)
    truncated: list[int] = []
    bar = tqdm(total=counts[0], unit=" pairs", disable=None if output is not None else True, file=sys.stderr)
    with atomic_output(output) as out:
        while window := list(islice(pairs, WINDOW_PAIRS)):
            scores = score_pairs(translator, [s for (_, s), _ in window], [t for _, (_, t) in window])
            out.write("".join((score.json() if as_json else score.line()) + "\n" for score in scores))
            truncated += [number for ((number, _), _), score in zip(window, scores, strict=True) if score.truncated]
            bar.update(len(window))
    bar.close()
    return truncated
