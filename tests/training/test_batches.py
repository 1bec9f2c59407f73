"""Token-budget batches: every pair once per epoch, within budget, little padding, seeded order."""

from __future__ import annotations

import numpy as np

from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from mtkit.training.batches import CorpusMix, collate, token_batches


def lengths(count: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 40, count)
    return src, np.clip(src + rng.integers(-3, 4, count), 1, None)


def test_every_pair_appears_once_and_batches_fit_the_budget():
    src, tgt = lengths()
    batches, skipped = token_batches(src, tgt, batch_tokens=200, seed=1, epoch=0, max_length=1000)
    assert skipped == 0
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    for batch in batches:
        widest = max(int(src[batch].max()), int(tgt[batch].max())) + 1
        assert len(batch) == 1 or widest * len(batch) <= 200


def test_length_sorting_keeps_padding_low():
    src, tgt = lengths(2000)
    batches, _ = token_batches(src, tgt, batch_tokens=400, seed=1, epoch=0, max_length=1000)
    real = sum(int((tgt[b] + 1).sum()) for b in batches)
    padded = sum(len(b) * int(tgt[b].max() + 1) for b in batches)
    assert 1 - real / padded < 0.15


def test_order_depends_on_seed_and_epoch_only():
    src, tgt = lengths()
    first = token_batches(src, tgt, batch_tokens=200, seed=1, epoch=0, max_length=1000)[0]
    again = token_batches(src, tgt, batch_tokens=200, seed=1, epoch=0, max_length=1000)[0]
    next_epoch = token_batches(src, tgt, batch_tokens=200, seed=1, epoch=1, max_length=1000)[0]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert [b.tolist() for b in first] != [b.tolist() for b in next_epoch]


def test_pairs_longer_than_the_model_allows_are_skipped_and_counted():
    src = np.array([3, 50, 4, 5])
    tgt = np.array([3, 4, 60, 5])
    batches, skipped = token_batches(src, tgt, batch_tokens=100, seed=1, epoch=0, max_length=20)
    assert skipped == 2
    assert sorted(np.concatenate(batches).tolist()) == [0, 3]


def test_collate_shifts_the_target_for_teacher_forcing():
    batch = collate([np.array([7, 8, 9]), np.array([5])], [np.array([10, 11]), np.array([12, 13, 14])])
    assert batch.src.tolist() == [[7, 8, 9, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.src_mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 10, 11, PAD_ID], [BOS_ID, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[10, 11, EOS_ID, PAD_ID], [12, 13, 14, EOS_ID]]
    assert batch.num_tokens == 7


def test_collate_rounds_lengths_up_to_the_multiple_with_padding_only():
    batch = collate([np.array([7, 8, 9]), np.array([5])], [np.array([10, 11]), np.array([12, 13, 14])], length_multiple=8)
    assert batch.src.shape == batch.tgt_in.shape == batch.tgt_out.shape == (2, 8)
    assert batch.src[0].tolist() == [7, 8, 9, EOS_ID] + [PAD_ID] * 4
    assert batch.tgt_out[1].tolist() == [12, 13, 14, EOS_ID] + [PAD_ID] * 4
    assert batch.src_mask.sum().item() == 6 and batch.num_tokens == 7


def test_corpus_mix_draws_each_corpus_by_its_weight_and_resamples_each_epoch():
    corpus = np.array([0] * 30 + [1] * 40 + [2] * 10, dtype=np.int16)
    mix = CorpusMix(corpus, [2.5, 0.25, 1.0], names=["news", "crawl", "dict"])
    drawn = mix.draw(seed=1, epoch=0)
    assert mix.counts(drawn) == {"news": 75, "crawl": 10, "dict": 10}
    news = np.bincount(drawn[corpus[drawn] == 0], minlength=30)
    assert sorted(set(news.tolist())) == [2, 3] and (news == 3).sum() == 15  # every pair twice, half a third time
    assert sorted(drawn[corpus[drawn] == 2].tolist()) == list(range(70, 80))  # weight 1: each pair once
    assert np.array_equal(drawn, mix.draw(seed=1, epoch=0))
    assert not np.array_equal(drawn, mix.draw(seed=1, epoch=1))  # another tenth of crawl, another half of news


def test_one_corpus_of_weight_one_draws_every_pair_once_in_order():
    corpus = np.zeros(50, dtype=np.int16)
    assert CorpusMix(corpus, [1.0], names=["train"]).draw(seed=3, epoch=7).tolist() == list(range(50))
