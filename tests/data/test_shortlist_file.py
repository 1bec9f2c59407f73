"""The vocabulary shortlist's counts from word links, its file and its checks."""

from __future__ import annotations

import numpy as np
import pytest

from mtkit.data.shortlist import Shortlist, shortlist_from_links
from mtkit.errors import MtkitError

# Source pieces 5, 6, 7; target pieces 10, 11, 12, 13. 5 is linked to 10 three times and to 13 once.
SOURCES = [[5, 6], [5, 7], [5, 6], [5, 6], [6]]
TARGETS = [[10, 11], [10, 12], [10, 11], [13, 11], [11]]
LINKS = [np.array([[0, 0], [1, 1]])] * 4 + [np.array([[0, 0]])]
SPECIALS = [0, 1, 2, 3]


def built(k: int = 2, frequent: int = 1) -> Shortlist:
    return shortlist_from_links(SOURCES, TARGETS, links=LINKS, vocabularies=(8, 14), k=k, frequent=frequent, always=SPECIALS)


def test_each_source_piece_keeps_its_most_often_linked_target_pieces_first():
    shortlist = built()
    assert shortlist.candidates[5].tolist() == [10, 13]  # 3 links, then 1
    assert shortlist.candidates[6].tolist() == [11, -1]
    assert shortlist.candidates[7].tolist() == [12, -1]
    assert (shortlist.candidates[[0, 1, 2, 3, 4]] == -1).all()  # never linked
    assert built(k=1).candidates[5].tolist() == [10]


def test_the_specials_and_the_most_frequent_target_pieces_are_always_kept():
    shortlist = built(frequent=1)
    assert shortlist.frequent.tolist() == [*SPECIALS, 11]  # 11 comes 4 times, 10 three
    assert shortlist.pieces([[7]]).tolist() == [*SPECIALS, 11, 12]
    assert shortlist.pieces([[5], [7]]).tolist() == [*SPECIALS, 10, 11, 12, 13]


def test_coverage_counts_the_reference_pieces_in_their_own_sources_shortlist():
    shortlist = built(k=1, frequent=0)
    # [5, 6] -> {10, 11}: covers 10 and 11, not 13; [7] -> {12}: covers 12
    assert shortlist.coverage([[5, 6], [7]], [[10, 13, 11], [12]]) == pytest.approx(3 / 4)


def test_a_saved_shortlist_loads_as_it_was(tmp_path):
    shortlist = built()
    shortlist.save(tmp_path / "s.safetensors")
    loaded = Shortlist.load(tmp_path / "s.safetensors", src_vocab=8, tgt_vocab=14)
    assert loaded.candidates.tolist() == shortlist.candidates.tolist()
    assert loaded.frequent.tolist() == shortlist.frequent.tolist()
    assert loaded.info == shortlist.info


@pytest.mark.parametrize(
    ("vocabularies", "needle"),
    [((9, 14), "model reads 9 source pieces"), ((8, 12), "target id 13 outside the model's 12")],
)
def test_a_shortlist_of_another_vocabulary_is_one_line(tmp_path, vocabularies, needle):
    built().save(tmp_path / "s.safetensors")
    with pytest.raises(MtkitError, match=needle) as raised:
        Shortlist.load(tmp_path / "s.safetensors", src_vocab=vocabularies[0], tgt_vocab=vocabularies[1])
    assert "\n" not in str(raised.value) and "mtkit shortlist RUN" in str(raised.value)


@pytest.mark.parametrize("content", [b"", b"not a shortlist", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "])
def test_a_damaged_file_is_one_line(tmp_path, content):
    path = tmp_path / "s.safetensors"
    path.write_bytes(content)
    with pytest.raises(MtkitError, match="not a shortlist file") as raised:
        Shortlist.load(path, src_vocab=8, tgt_vocab=14)
    assert "\n" not in str(raised.value) and str(path) in str(raised.value)


def test_a_file_larger_than_the_models_shortlist_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "s.safetensors"
    path.write_bytes(b"\0" * (2 << 20))
    with pytest.raises(MtkitError, match="more than a shortlist of this model holds"):
        Shortlist.load(path, src_vocab=8, tgt_vocab=14)
