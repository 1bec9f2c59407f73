"""Finding repeated sentence pairs in a stream of any length, at 8 bytes a kept pair.

A pair is known by a 64-bit BLAKE2b hash of its text, never by the strings; `SeenHashes` keeps the
hashes in sorted numpy runs that merge like a binary counter (at most log2(n) runs, each searched
with a binary search). Two different pairs share a hash with odds of about n^2 / 2^65: 1 in
700,000 for a corpus of 5M pairs.
"""

from __future__ import annotations

import hashlib

import numpy as np

Pair = tuple[str, str]


def pair_hashes(pairs: list[Pair]) -> np.ndarray:
    """The 64-bit hash of each (source, target) pair, as a uint64 array."""
    digests = b"".join(
        hashlib.blake2b(f"{src}\t{tgt}".encode("utf-8", "surrogatepass"), digest_size=8).digest() for src, tgt in pairs
    )
    return np.frombuffer(digests, dtype=np.uint64)


class SeenHashes:
    """A growing set of 64-bit hashes, 8 bytes each."""

    def __init__(self) -> None:
        self.runs: list[np.ndarray] = []  # sorted, unique, each run at most half the size of the one before

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)

    def add_new(self, hashes: np.ndarray) -> np.ndarray:
        """A mask of the hashes seen neither before nor earlier in `hashes`; those are added."""
        new = np.zeros(len(hashes), dtype=bool)
        new[np.unique(hashes, return_index=True)[1]] = True  # the first of equal hashes in this chunk
        for run in self.runs:
            position = np.minimum(np.searchsorted(run, hashes), len(run) - 1)
            new &= run[position] != hashes
        self._push(np.sort(hashes[new]))
        return new

    def _push(self, run: np.ndarray) -> None:
        """Merge runs of similar size so that the number of runs stays logarithmic."""
        while self.runs and len(self.runs[-1]) <= 2 * len(run):
            run = np.sort(np.concatenate([self.runs.pop(), run]), kind="mergesort")
        if len(run):
            self.runs.append(run)
