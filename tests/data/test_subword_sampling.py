"""Subword regularisation: training pairs re-segmented by SentencePiece sampling every epoch, seeded."""

from __future__ import annotations

import numpy as np
import pytest

from mtkit.config import config_from_dict
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import load_tokenizers
from mtkit.errors import MtkitError
from mtkit.training.batches import ParallelIds, SampledIds


def pair_ids(ids: ParallelIds) -> list[tuple[list[int], list[int]]]:
    return [(ids.src[i].tolist(), ids.tgt[i].tolist()) for i in range(len(ids))]


@pytest.fixture(scope="module")
def reverse_data(reverse_task):
    """The prepared reverse task's training split and its tokenizers."""
    return load_prepared(reverse_task.data_path, "train"), load_tokenizers(
        reverse_task.data_path, joint=reverse_task.tokenizer.joint
    )


def test_segmentations_differ_between_epochs_and_repeat_with_one_seed(reverse_data):
    split, tokenizers = reverse_data
    sampled = SampledIds(split, tokenizers, alpha=0.3, seed=7)
    epoch0, epoch1 = pair_ids(sampled.for_epoch(0)), pair_ids(sampled.for_epoch(1))
    changed = sum(a != b for a, b in zip(epoch0, epoch1, strict=True))
    assert changed > len(epoch0) // 2  # BPE-dropout of 0.3 re-splits most 3-7 word pairs
    again = SampledIds(split, tokenizers, alpha=0.3, seed=7)
    assert pair_ids(again.for_epoch(1)) == epoch1 and pair_ids(again.for_epoch(0)) == epoch0
    assert pair_ids(SampledIds(split, tokenizers, alpha=0.3, seed=8).for_epoch(0)) != epoch0


def test_sampled_pieces_spell_the_same_text_and_are_longer_than_the_best_segmentation(reverse_data):
    split, tokenizers = reverse_data
    sampled, best = SampledIds(split, tokenizers, alpha=0.3, seed=1).for_epoch(0), ParallelIds(split)
    for i in range(0, len(best), 97):
        assert tokenizers.src.decode(sampled.src[i]) == split[i]["src"]
        assert tokenizers.tgt.decode(sampled.tgt[i]) == split[i]["tgt"]
    assert np.mean(sampled.src.lengths) > np.mean(best.src.lengths)


def test_sampling_alpha_is_checked_at_load():
    with pytest.raises(MtkitError, match=r"'tokenizer.sampling_alpha' is 1\.5"):
        config_from_dict({"tokenizer": {"sampling_alpha": 1.5}})
