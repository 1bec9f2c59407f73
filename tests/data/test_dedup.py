"""Tests for mtkit.data.dedup: the compact set of pair hashes that finds repeats in a stream."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mtkit.data.dedup import SeenHashes, pair_hashes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 300), max_size=60), max_size=30))
def test_add_new_marks_exactly_the_first_occurrences_of_a_stream(chunks):
    seen, reference = SeenHashes(), set()
    for chunk in chunks:
        hashes = np.array(chunk, dtype=np.uint64)
        expected = []
        for value in chunk:
            expected.append(value not in reference)
            reference.add(value)
        assert seen.add_new(hashes).tolist() == expected
    assert len(seen) == len(reference)
    assert len(seen.runs) <= max(1, len(reference)).bit_length()  # runs merge: a logarithmic number of them


def test_pairs_hash_by_both_sides_and_the_hash_is_stable():
    hashes = pair_hashes([("a b", "c"), ("a", "b c"), ("a b", "c"), ("c", "a b")])
    assert hashes.dtype == np.uint64
    assert hashes[0] == hashes[2]
    assert len({int(h) for h in hashes}) == 3
    # Golden value: BLAKE2b, not Python's hash(), so every process and every run agrees.
    assert int(pair_hashes([("Ein Hund.", "A dog.")])[0]) == 0x0A4083608E100AA7


def test_eight_bytes_a_hash_for_a_large_stream():
    seen = SeenHashes()
    rng = np.random.default_rng(0)
    for _ in range(20):
        seen.add_new(rng.integers(0, 2**63, 50_000, dtype=np.uint64))
    assert len(seen) == 1_000_000
    assert sum(run.nbytes for run in seen.runs) == 8_000_000
