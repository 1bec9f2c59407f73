"""mtkit.data.word_alignment: the two directions joined, and eflomal guided by the priors of a corpus."""

from __future__ import annotations

import random

import pytest

from mtkit.data.word_alignment import corpus_priors, eflomal_links, pharaoh_links, symmetrized, text_tokens

pytest.importorskip("eflomal")


def test_grow_diag_final_and_keeps_agreement_and_grows_next_to_it() -> None:
    forward = {(0, 0), (1, 1), (4, 4)}
    reverse = {(0, 0), (0, 3), (4, 5)}
    # (1, 1) grows from (0, 0), its neighbour; (4, 4) comes in at the end, both its words free; (0, 3) and (4, 5)
    # never do: their source words are taken by then
    assert symmetrized(forward, reverse) == {(0, 0), (1, 1), (4, 4)}


def test_pharaoh_lines_read_back_and_tokens_split_punctuation() -> None:
    assert pharaoh_links("0-0 2-1 1-3") == {(0, 0), (2, 1), (1, 3)}
    assert text_tokens("Ein Hut, rot!") == ["ein", "hut", ",", "rot", "!"]


def toy_corpus(pairs: int, seed: int) -> tuple[list[str], list[str]]:
    """A made-up language whose word `wN` translates as `tN`, in reverse order: what an aligner must learn."""
    rng = random.Random(seed)
    sources, targets = [], []
    for _ in range(pairs):
        words = rng.sample(range(40), rng.randint(3, 7))
        sources.append(" ".join(f"w{n}" for n in words))
        targets.append(" ".join(f"t{n}" for n in reversed(words)))
    return sources, targets


def test_the_priors_of_a_corpus_align_a_single_new_pair_as_the_corpus_does() -> None:
    sources, targets = toy_corpus(400, seed=1)
    priors = corpus_priors(sources, targets)
    assert "LEX\tw3\tt3\t" in priors
    new = [f"w{n}" for n in (5, 17, 33, 2, 9)]
    expected = {(i, len(new) - 1 - i) for i in range(len(new))}
    guided = eflomal_links([new], [[f"t{word[1:]}" for word in reversed(new)]], priors=priors, quick=True)[0]
    assert symmetrized(*guided) == expected
    assert eflomal_links([[], new], [["t1"], []]) == [(set(), set()), (set(), set())]  # an empty side: no links
