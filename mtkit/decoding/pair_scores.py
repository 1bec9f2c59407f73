"""`mtkit score`: the model's log-probability of given translations (filtering, reranking, QE).

Each pair is scored teacher-forced: the sum of the log-probabilities of the target's pieces and
its final EOS given the source, read the way the model reads text (normalised, SentencePiece).
Pairs are sorted into length batches of `decode.batch_beam_tokens` and put back in input order (files
stream in windows: `mtkit.decoding.files.score_files`). A pair longer than the model's positions is
scored on its first pieces, and counted in a warning.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from mtkit.data.tokenizer import TokenizerPair, tagged
from mtkit.decoding.engine import Capability, Engine, length_batches, require
from mtkit.errors import MtkitError
from mtkit.textio import model_text


@dataclass(kw_only=True)
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


def score_pairs(
    engine: Engine,
    *,
    tokenizers: TokenizerPair,
    normalize: str,
    batch_tokens: int,
    sources: Sequence[str],
    targets: Sequence[str],
    tag: int | None = None,
    target_lead: Sequence[int] = (),
) -> list[PairScore]:
    """The score of each (source, target) pair, in input order (`Translator.score` with its engine and settings);
    each source after `tag` (a tagged model's target-language tag, or a source-language code), if any, and each
    target after `target_lead` (a target-language code, scored as part of the target)."""
    require(engine, Capability.SCORE, option="mtkit score")
    if len(sources) != len(targets):
        raise MtkitError(f"{len(sources)} sources but {len(targets)} targets: give one target per source")
    limit = engine.max_positions - 1  # room for EOS (source) or BOS (target)
    source_ids = tagged([tokenizers.src.encode(model_text(s, normalize)) for s in sources], tag)
    target_ids = [[*target_lead, *tokenizers.tgt.encode(model_text(t, normalize))] for t in targets]
    truncated = [len(s) > limit or len(t) > limit for s, t in zip(source_ids, target_ids, strict=True)]
    source_ids, target_ids = [s[:limit] for s in source_ids], [t[:limit] for t in target_ids]
    scores: list[PairScore | None] = [None] * len(sources)
    lengths = [max(len(s), len(t)) for s, t in zip(source_ids, target_ids, strict=True)]
    for batch in length_batches(lengths, 1, batch_tokens=batch_tokens):
        found = engine.score([source_ids[i] for i in batch], [target_ids[i] for i in batch])
        for index, log_probs in zip(batch, found, strict=True):
            scores[index] = PairScore(log_prob=sum(log_probs), tokens=len(log_probs), truncated=truncated[index])
    return [score for score in scores if score is not None]
