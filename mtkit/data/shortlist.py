"""A vocabulary shortlist: for each source piece the target pieces it is most often aligned with.

Search then computes the output layer only for the target pieces a batch's sources can lead to
(`mtkit.decoding.shortlist`), as Marian's lexical shortlists and CTranslate2's vocabulary map do. The
shortlist is built from word alignments of SentencePiece pieces (`align_pieces`, with `eflomal`, the
aligner mozilla/translations builds its shortlists with): each source piece keeps its `k` most often
linked target pieces, and every batch also keeps the `frequent` most frequent target pieces and the
special, reserved and language pieces (`Shortlist.frequent`).

The file (RUN/shortlist.safetensors, written whole by the one atomic writer) holds two int32 tensors,
`candidates` (source vocabulary, K; -1 where a piece has fewer) and `frequent` (M,), and as metadata
how it was built and its coverage: the share of the validation references' target pieces found in
their source's shortlist.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtkit.data.word_alignment import eflomal_links
from mtkit.errors import MtkitError
from mtkit.textio import write_file

MOST_K = 10_000  # the largest K a file may hold: bounds what a file makes us read
_REBUILD = "build it again with `mtkit shortlist RUN`"


@dataclass(frozen=True, kw_only=True)
class Shortlist:
    """Per source piece its likely target pieces (`candidates`, -1 pads), and the pieces always kept (`frequent`)."""

    candidates: np.ndarray  # (source vocabulary, K) int32, -1: none
    frequent: np.ndarray  # (M,) int32: the most frequent target pieces and every special one
    target_vocab: int  # the target pieces of the model it was built for
    info: dict[str, str | int | float]  # how it was built (lines, k, frequent, aligner) and its coverage

    def pieces(self, sources: Iterable[Sequence[int]]) -> np.ndarray:
        """The sorted target ids a search of `sources` (source ids) may emit: their candidates and `frequent`."""
        rows = np.fromiter((i for source in sources for i in source), dtype=np.int64)
        rows = rows[(rows >= 0) & (rows < len(self.candidates))]
        found = self.candidates[np.unique(rows)].ravel()
        return np.union1d(found[found >= 0], self.frequent).astype(np.int64)

    def coverage(self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> float:
        """The share of the pieces of `targets` in their own source's shortlist (1.0 when there are none)."""
        covered = total = 0
        for source, target in zip(sources, targets, strict=True):
            covered += int(np.isin(np.asarray(target, dtype=np.int64), self.pieces([source])).sum())
            total += len(target)
        return covered / total if total else 1.0

    def save(self, path: Path) -> None:
        """The file, atomically (`textio.write_file`)."""
        from safetensors.numpy import save

        tensors = {
            "candidates": np.ascontiguousarray(self.candidates, dtype=np.int32),
            "frequent": self.frequent.astype(np.int32),
        }
        write_file(path, save(tensors, metadata={"mtkit_shortlist": json.dumps(self.info)}))

    @classmethod
    def load(cls, path: Path, *, src_vocab: int, tgt_vocab: int) -> Shortlist:
        """The file at `path`, checked against the model's vocabularies; a bad file is one line naming it."""
        from safetensors import SafetensorError, safe_open

        most = src_vocab * min(MOST_K, tgt_vocab) * 4 + tgt_vocab * 4 + (1 << 20)  # tensors and a header
        if path.stat().st_size > most:
            raise MtkitError(f"{path}: {path.stat().st_size} bytes, more than a shortlist of this model holds; {_REBUILD}")
        try:
            with safe_open(str(path), framework="np") as file:
                info = json.loads((file.metadata() or {})["mtkit_shortlist"])
                candidates, frequent = file.get_tensor("candidates"), file.get_tensor("frequent")
        except (SafetensorError, KeyError, ValueError, OSError) as err:
            raise MtkitError(f"{path}: not a shortlist file ({str(err).splitlines()[0][:80]}); {_REBUILD}") from None
        _check_ids(path, candidates, frequent, src_vocab=src_vocab, tgt_vocab=tgt_vocab)
        return cls(candidates=candidates.astype(np.int64), frequent=frequent.astype(np.int64), target_vocab=tgt_vocab, info=info)


def _check_ids(path: Path, candidates: np.ndarray, frequent: np.ndarray, *, src_vocab: int, tgt_vocab: int) -> None:
    """One line unless the tensors fit a model of these vocabularies."""
    if candidates.ndim != 2 or candidates.shape[0] != src_vocab or frequent.ndim != 1:
        shapes = f"candidates {list(candidates.shape)}, frequent {list(frequent.shape)}"
        raise MtkitError(f"{path}: {shapes}, but the model reads {src_vocab} source pieces; {_REBUILD}")
    low = min(int(candidates.min(initial=-1)), int(frequent.min(initial=0)) - 1)
    high = max(int(candidates.max(initial=-1)), int(frequent.max(initial=0)))
    if low < -1 or high >= tgt_vocab:
        raise MtkitError(f"{path}: target id {high if high >= tgt_vocab else low} outside the model's {tgt_vocab}; {_REBUILD}")


def align_pieces(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """eflomal's word alignments of each pair of id sequences, both directions joined: per pair (links, 2) of
    (source position, target position). Pairs with an empty side get no links."""
    found = eflomal_links([list(map(str, source)) for source in sources], [list(map(str, target)) for target in targets])
    return [np.array(sorted(ahead | back), dtype=np.int64).reshape(-1, 2) for ahead, back in found]


def shortlist_from_links(
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    *,
    links: Sequence[np.ndarray],
    vocabularies: tuple[int, int],
    k: int,
    frequent: int,
    always: Iterable[int],
) -> Shortlist:
    """Each source piece's `k` most often linked target pieces (ties: the lower id), the `frequent` most frequent
    target pieces and the `always` ones; `vocabularies` is (source, target) pieces."""
    src_vocab, tgt_vocab = vocabularies
    linked = _linked_ids(sources, targets, links)  # (links, 2) source id, target id
    keys, counts = np.unique(linked[:, 0] * tgt_vocab + linked[:, 1], return_counts=True)
    order = np.lexsort((keys % tgt_vocab, -counts, keys // tgt_vocab))  # by source, most links first, then target id
    keys = keys[order]
    source_of, target_of = keys // tgt_vocab, keys % tgt_vocab
    starts = np.searchsorted(source_of, source_of, side="left")
    rank = np.arange(len(keys)) - starts  # place of each pair within its source piece
    candidates = np.full((src_vocab, k), -1, dtype=np.int64)
    chosen = rank < k
    candidates[source_of[chosen], rank[chosen]] = target_of[chosen]
    target_counts = np.bincount(np.fromiter((i for t in targets for i in t), dtype=np.int64), minlength=tgt_vocab)
    common = np.argsort(-target_counts, kind="stable")[:frequent]
    kept = np.union1d(common[target_counts[common] > 0], np.fromiter(always, dtype=np.int64))
    info = {"k": k, "frequent": frequent, "lines": len(sources)}
    return Shortlist(candidates=candidates, frequent=kept, target_vocab=tgt_vocab, info=info)


def _linked_ids(sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], links: Sequence[np.ndarray]) -> np.ndarray:
    """(links, 2): the source and target id of every link (positions turned into the pieces they hold)."""
    pairs = [
        np.stack([np.asarray(source)[pair[:, 0]], np.asarray(target)[pair[:, 1]]], axis=1)
        for source, target, pair in zip(sources, targets, links, strict=True)
        if len(pair)
    ]
    return np.concatenate(pairs).astype(np.int64) if pairs else np.zeros((0, 2), dtype=np.int64)
