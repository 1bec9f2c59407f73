"""Length buckets (`train.shapes`): the same pairs as token-budget batches, at most K shapes, the budget
kept, seeded order, equal rank shares; and the vectorised collation against the loop it replaced."""

from __future__ import annotations

import gzip

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import MULTI30K, prepared_reverse_task

from mtkit.config import TrainConfig, config_from_dict
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, load_tokenizers
from mtkit.errors import MtkitError
from mtkit.training.batches import (
    Batch,
    BucketedIds,
    CorpusMix,
    IdColumn,
    ParallelIds,
    TrainingData,
    collate,
    epoch_batches,
)
from mtkit.training.buckets import batch_length, bucket_batches, bucket_lengths, shapes_and_padding
from mtkit.training.levers import AUTO_SHAPES, Levers
from mtkit.training.loss import sequence_loss


def multi30k_lengths() -> tuple[np.ndarray, np.ndarray]:
    """Realistic lengths: the test slice of Multi30k (de-en), in words x 1.3 (about its pieces)."""

    def words(lang: str) -> np.ndarray:
        with gzip.open(MULTI30K / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            return np.array([len(line.split()) * 13 // 10 for line in handle])

    return words("de"), words("en")


def random_ids(lengths: np.ndarray, rng: np.random.Generator) -> IdColumn:
    return IdColumn(pa.array([rng.integers(4, 100, n).tolist() for n in lengths], pa.list_(pa.int32())))


def two_corpora(seed: int = 0) -> tuple[CorpusMix, ParallelIds]:
    """1,500 pairs of Multi30k lengths in two corpora weighted 2.0 and 0.5 (repeats and a partial draw)."""
    src, tgt = (side[:1500] for side in multi30k_lengths())
    rng = np.random.default_rng(seed)
    corpus = (np.arange(1500) >= 1000).astype(np.int16)
    return CorpusMix(corpus, [2.0, 0.5], names=["a", "b"]), ParallelIds.of(random_ids(src, rng), random_ids(tgt, rng))


def lengths_of(mix: CorpusMix, ids: ParallelIds, shapes: int, batch_tokens: int) -> np.ndarray:
    cost = np.maximum(ids.src.lengths, ids.tgt.lengths) + 1
    return bucket_lengths(cost, np.asarray(mix.weights)[mix.corpus], shapes=shapes, batch_tokens=batch_tokens)


def test_buckets_draw_the_same_pairs_as_token_budget_batches():
    mix, ids = two_corpora()
    lengths = lengths_of(mix, ids, 8, 600)
    for epoch in range(3):
        plain, _, plain_skipped = epoch_batches(mix, ids, batch_tokens=600, seed=1, epoch=epoch, max_length=30)
        bucketed, _, skipped = epoch_batches(mix, ids, batch_tokens=600, seed=1, epoch=epoch, max_length=30, lengths=lengths)
        pairs = np.concatenate(bucketed)
        assert skipped == plain_skipped > 0  # max_length=30 skips some
        assert np.array_equal(np.sort(pairs[pairs >= 0]), np.sort(np.concatenate(plain)))


@pytest.mark.parametrize("batch_tokens", [300, 4096])
def test_at_most_k_shapes_across_epochs_within_the_token_budget(batch_tokens):
    src, tgt = multi30k_lengths()
    lengths = bucket_lengths(np.maximum(src, tgt) + 1, np.ones(len(src)), shapes=8, batch_tokens=batch_tokens)
    assert len(lengths) <= 8 and lengths[-1] == max(src.max(), tgt.max()) + 1
    shapes = set()
    for epoch in range(4):
        batches, skipped = bucket_batches(
            src, tgt, lengths=lengths, batch_tokens=batch_tokens, seed=3, epoch=epoch, max_length=1000
        )
        assert skipped == 0
        for batch in batches:
            pairs = batch[batch >= 0]
            length = batch_length(lengths, int(np.maximum(src[pairs], tgt[pairs]).max()) + 1)
            assert length in lengths and len(pairs) > 0
            assert len(batch) * length <= batch_tokens or len(batch) == 1
            shapes.add((len(batch), length))
    assert len(shapes) <= 8
    count, padding = shapes_and_padding(batches, src, tgt_lengths=tgt, lengths=lengths)
    assert count <= 8 and 0 < padding < 0.35  # 3,000 pairs: few batches a bucket, so its last one weighs


def test_buckets_depend_on_seed_and_epoch_only():
    src, tgt = multi30k_lengths()
    lengths = bucket_lengths(np.maximum(src, tgt) + 1, np.ones(len(src)), shapes=8, batch_tokens=800)
    first, again, other = (
        bucket_batches(src, tgt, lengths=lengths, batch_tokens=800, seed=1, epoch=epoch, max_length=1000)[0]
        for epoch in (0, 0, 1)
    )
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert [b.tolist() for b in first] != [b.tolist() for b in other]


def test_bucket_lengths_are_the_cheapest_and_fewer_when_another_does_not_pay():
    costs = np.array([2] * 50 + [3] * 50 + [10] * 50)
    assert bucket_lengths(costs, np.ones(150), shapes=3, batch_tokens=1000).tolist() == [
        3,
        10,
    ]  # 2 and 3 apart would waste a last batch
    assert bucket_lengths(costs, np.ones(150), shapes=2, batch_tokens=1000).tolist() == [3, 10]
    assert bucket_lengths(costs, np.ones(150), shapes=1, batch_tokens=1000).tolist() == [10]
    assert bucket_lengths(np.array([4, 4]), np.ones(2), shapes=5, batch_tokens=100).tolist() == [4]


def test_ranks_get_disjoint_equal_shares_and_a_new_process_the_same_epoch(tmp_path):
    config = prepared_reverse_task(tmp_path, batch_tokens=200, shapes="4")
    tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    data, again = TrainingData(config, tokenizers), TrainingData(config, tokenizers)
    whole = data.epoch(1, 1024, shapes=4)
    assert isinstance(whole.ids, BucketedIds) and 1 <= whole.shapes <= 4 and 0 < whole.padding < 0.5
    shares = [data.epoch(1, 1024, rank=rank, world_size=2, shapes=4).batches for rank in (0, 1)]
    assert len(shares[0]) == len(shares[1]) == len(whole.batches) // 2
    pairs = [set(np.concatenate(share).tolist()) - {-1} for share in shares]
    assert not pairs[0] & pairs[1]  # the reverse task's pairs are each drawn once
    resumed = again.epoch(1, 1024, shapes=4)  # what a resumed run rebuilds
    assert all(np.array_equal(a, b) for a, b in zip(whole.batches, resumed.batches, strict=True))
    assert not np.array_equal(np.concatenate(data.epoch(2, 1024, shapes=4).batches), np.concatenate(whole.batches))


def loop_collate(src_ids: list, tgt_ids: list, length_multiple: int = 1) -> Batch:
    """The row loop `collate` was before it was vectorised: the reference it must equal bit for bit."""
    rows = len(src_ids)
    src_len = -(-(max(len(s) for s in src_ids) + 1) // length_multiple) * length_multiple
    tgt_len = -(-(max(len(t) for t in tgt_ids) + 1) // length_multiple) * length_multiple
    src = np.full((rows, src_len), PAD_ID, dtype=np.int64)
    tgt_in = np.full((rows, tgt_len), PAD_ID, dtype=np.int64)
    tgt_out = np.full((rows, tgt_len), PAD_ID, dtype=np.int64)
    for row, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        src[row, : len(s)] = s
        src[row, len(s)] = EOS_ID
        tgt_in[row, 0] = BOS_ID
        tgt_in[row, 1 : len(t) + 1] = t
        tgt_out[row, : len(t)] = t
        tgt_out[row, len(t)] = EOS_ID
    src_t, tgt_in_t, tgt_out_t = (torch.from_numpy(a) for a in (src, tgt_in, tgt_out))
    return Batch(
        src=src_t, src_mask=src_t.ne(PAD_ID), tgt_in=tgt_in_t, tgt_out=tgt_out_t, num_tokens=int(sum(len(t) + 1 for t in tgt_ids))
    )


def assert_same_batch(batch: Batch, reference: Batch) -> None:
    for name in ("src", "src_mask", "tgt_in", "tgt_out"):
        ours, theirs = getattr(batch, name), getattr(reference, name)
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), name
    assert batch.num_tokens == reference.num_tokens


@pytest.mark.parametrize("length_multiple", [1, 8])
def test_vectorised_collate_equals_the_row_loop(length_multiple):
    rng = np.random.default_rng(7)
    ids = ParallelIds.of(random_ids(rng.integers(0, 30, 200), rng), random_ids(rng.integers(1, 30, 200), rng))
    for _ in range(20):
        indices = rng.choice(200, rng.integers(1, 40), replace=False)
        src, tgt = [ids.src[i] for i in indices], [ids.tgt[i] for i in indices]
        reference = loop_collate(src, tgt, length_multiple)
        assert_same_batch(ids.collate(indices, pin_memory=False, length_multiple=length_multiple), reference)
        assert_same_batch(collate(src, tgt, pin_memory=False, length_multiple=length_multiple), reference)


def test_a_bucket_batch_is_padded_to_its_length_and_empty_rows_add_no_loss():
    src, tgt = (
        IdColumn(pa.array([[5, 6], [7, 8, 9]], pa.list_(pa.int32()))),
        IdColumn(pa.array([[10], [11, 12]], pa.list_(pa.int32()))),
    )
    ids = BucketedIds(ParallelIds.of(src, tgt), np.array([3, 6, 9]))
    batch = ids.collate(np.array([0, -1, 1, -1]))
    assert batch.src.shape == batch.tgt_in.shape == batch.tgt_out.shape == (4, 6)  # longest needs 4: bucket 6
    assert batch.src[1].tolist() == [EOS_ID] + [PAD_ID] * 5 and batch.tgt_in[1].tolist() == [BOS_ID] + [PAD_ID] * 5
    assert batch.tgt_out[1].tolist() == [PAD_ID] * 6 and batch.num_tokens == 5
    plain = ParallelIds.of(src, tgt).collate(np.array([0, 1]))
    assert_same_batch(Batch(src=batch.src[[0, 2], :4], src_mask=batch.src_mask[[0, 2], :4], tgt_in=batch.tgt_in[[0, 2], :3],
                            tgt_out=batch.tgt_out[[0, 2], :3], num_tokens=batch.num_tokens), plain)  # fmt: skip
    logits = torch.randn(4, 6, 20)
    real_loss = sequence_loss(logits[[0, 2], :3], plain.tgt_out, label_smoothing=0.1)
    torch.testing.assert_close(sequence_loss(logits, batch.tgt_out, label_smoothing=0.1), real_loss)


def test_the_shapes_key_resolves_like_the_levers_and_refuses_length_multiple_with_it():
    assert Levers.of(TrainConfig(shapes="auto"), torch.device("cuda")).shapes == AUTO_SHAPES
    assert Levers.of(TrainConfig(shapes="auto"), torch.device("cpu")).shapes == 0
    assert Levers.of(TrainConfig(), torch.device("cuda")).shapes == 0  # off by default until the GPU figures
    assert config_from_dict({"train": {"shapes": 12}}).train.shapes == "12"
    with pytest.raises(MtkitError, match=r"'train.shapes' is '8'; give train.length_multiple=1 with it"):
        config_from_dict({"train": {"shapes": 8, "length_multiple": 8}})
    with pytest.raises(MtkitError, match=r"'train.shapes' is '65'; give auto, 0 \(off\) or a number of shapes up to 64"):
        config_from_dict({"train": {"shapes": 65}})
