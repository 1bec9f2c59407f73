"""Token-budget batches for training: ids from memory-mapped Arrow columns, length-sorted, padded.

Teacher forcing convention, shared by every architecture: the source is `ids + EOS`, the decoder
input is `BOS + ids` and the decoder output (the loss target) is `ids + EOS`, padded with PAD.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor

from mtkit.config import Config, direction, recipe_key
from mtkit.data.corpora import corpus_names
from mtkit.data.prepare import corpus_lead, corpus_tag
from mtkit.data.store import PreparedSplit, corpus_column, load_prepared
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tag, TokenizerPair, seed_sampling, tagged
from mtkit.errors import MtkitError
from mtkit.training.buckets import batch_length, bucket_batches, bucket_lengths, shapes_and_padding


@dataclass(kw_only=True)
class Batch:
    src: Tensor  # (B, S) source ids + EOS
    src_mask: Tensor  # (B, S) bool, True on real tokens
    tgt_in: Tensor  # (B, T) BOS + target ids
    tgt_out: Tensor  # (B, T) target ids + EOS
    num_tokens: int  # real (non-pad) tokens in tgt_out
    src_padded: bool | None = None  # some source row is padded (from the lengths; None: not known)

    def to(self, device: torch.device) -> Batch:
        """On `device` (itself when already there); to a GPU the ids are copied without blocking (from pinned
        memory when `collate` pinned them) and the mask is computed there."""
        if self.src.device == device:
            return self
        non_blocking = device.type == "cuda"
        src = self.src.to(device, non_blocking=non_blocking)
        tgt_in, tgt_out = (ids.to(device, non_blocking=non_blocking) for ids in (self.tgt_in, self.tgt_out))
        return Batch(
            src=src,
            src_mask=src.ne(PAD_ID),
            tgt_in=tgt_in,
            tgt_out=tgt_out,
            num_tokens=self.num_tokens,
            src_padded=self.src_padded,
        )


class IdColumn:
    """A list<int32> Arrow column as flat values + offsets, without copying into Python lists."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        self.offsets = array.offsets.to_numpy()
        self.values = array.values.to_numpy(zero_copy_only=False)
        self.lengths = np.diff(self.offsets)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    def take(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids of rows `indices` one after another, and each row's length (0 for an empty row, index -1)."""
        indices = np.asarray(indices, dtype=np.int64)
        real = indices >= 0
        lengths = np.where(real, self.lengths[indices], 0)
        starts = np.where(real, self.offsets[indices], 0)
        # each id's position in `values`: its row's start, plus its place in the row
        positions = np.arange(int(lengths.sum())) + np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        return self.values[positions], lengths


class ParallelIds:
    """Source and target ids of one prepared split (its src_ids/tgt_ids columns)."""

    def __init__(self, split: PreparedSplit) -> None:
        self.src = IdColumn(split.table.column("src_ids"))
        self.tgt = IdColumn(split.table.column("tgt_ids"))

    @classmethod
    def of(cls, src: IdColumn, tgt: IdColumn) -> ParallelIds:
        ids = cls.__new__(cls)
        ids.src, ids.tgt = src, tgt
        return ids

    def __len__(self) -> int:
        return len(self.src.lengths)

    def collate(self, indices: np.ndarray, *, pin_memory: bool = False, length_multiple: int = 1) -> Batch:
        src, tgt = self.src.take(indices), self.tgt.take(indices)
        src_len = round_up(int(src[1].max()) + 1, length_multiple)
        tgt_len = round_up(int(tgt[1].max()) + 1, length_multiple)
        return padded_batch(src, tgt, lengths=(src_len, tgt_len), pin_memory=pin_memory)


class BucketedIds(ParallelIds):
    """The ids of an epoch cut into length buckets (`mtkit.training.buckets`): a batch is padded on both
    sides to its bucket's length, and its empty rows (index -1) hold a lone EOS/BOS and no target."""

    def __init__(self, ids: ParallelIds, lengths: np.ndarray) -> None:
        self.src, self.tgt, self.lengths = ids.src, ids.tgt, lengths

    def collate(self, indices: np.ndarray, *, pin_memory: bool = False, length_multiple: int = 1) -> Batch:
        """`length_multiple` has no effect here: the bucket fixes the lengths (config refuses both)."""
        src, tgt = self.src.take(indices), self.tgt.take(indices)
        length = batch_length(self.lengths, int(np.maximum(src[1], tgt[1]).max()) + 1)
        return padded_batch(src, tgt, lengths=(length, length), pin_memory=pin_memory, empty=np.asarray(indices) < 0)


class SampledIds:
    """Subword regularisation: the training pairs' text re-segmented by SentencePiece sampling, once per epoch.

    The segmentation of epoch e depends only on (seed, e), so a resumed run sees the same pieces.
    Encoding runs on one thread (SentencePiece's sampling repeats only then), every epoch: its cost
    grows with the corpus (docs/performance.md).
    """

    def __init__(
        self, split: PreparedSplit, tokenizers: TokenizerPair, *, alpha: float, seed: int, tags: Sequence[Tag] | None = None,
        leads: Sequence[Tag] | None = None,
    ) -> None:  # fmt: skip  # tags, leads: each pair's source tags and target code (None: none)
        self.src_text, self.tgt_text = split["src"], split["tgt"]
        self.tokenizers, self.alpha, self.seed, self.tags, self.leads = tokenizers, alpha, seed, tags, leads
        self._cached: tuple[int, ParallelIds] | None = None

    def for_epoch(self, epoch: int) -> ParallelIds:
        """The ids of every training pair as segmented for `epoch` (the same call twice gives the same ids)."""
        if self._cached is None or self._cached[0] != epoch:
            seed_sampling(self.seed * 1_000_003 + epoch)
            src = tagged(self.tokenizers.src.sample_batch(self.src_text, self.alpha), self.tags)
            tgt = tagged(self.tokenizers.tgt.sample_batch(self.tgt_text, self.alpha), self.leads)
            column = pa.list_(pa.int32())
            self._cached = (epoch, ParallelIds.of(IdColumn(pa.array(src, column)), IdColumn(pa.array(tgt, column))))
        return self._cached[1]


def collate(src_ids: list, tgt_ids: list, *, pin_memory: bool = False, length_multiple: int = 1) -> Batch:
    """Pad one batch of id sequences into the teacher-forcing tensors, each length rounded up to a
    multiple of `length_multiple` (`train.length_multiple`: fewer shapes for a compiled step)."""
    src_lengths, tgt_lengths = (np.array([len(ids) for ids in side], dtype=np.int64) for side in (src_ids, tgt_ids))
    src = (np.concatenate([np.asarray(ids, dtype=np.int64) for ids in src_ids]), src_lengths)
    tgt = (np.concatenate([np.asarray(ids, dtype=np.int64) for ids in tgt_ids]), tgt_lengths)
    shape = (round_up(int(src_lengths.max()) + 1, length_multiple), round_up(int(tgt_lengths.max()) + 1, length_multiple))
    return padded_batch(src, tgt, lengths=shape, pin_memory=pin_memory)


def padded_batch(
    src: tuple[np.ndarray, np.ndarray],
    tgt: tuple[np.ndarray, np.ndarray],
    *,
    lengths: tuple[int, int],
    pin_memory: bool = False,
    empty: np.ndarray | None = None,
) -> Batch:
    """The teacher-forcing tensors of rows given as (ids one after another, each row's length), padded
    to (src_len, tgt_len) = `lengths`, without a Python loop over rows. `empty` (bool per row) marks
    rows with no pair: their target is all PAD, so they add nothing to the loss or `num_tokens`."""
    (src_values, src_lengths), (tgt_values, tgt_lengths) = src, tgt
    rows, every_row = len(src_lengths), np.arange(len(src_lengths))
    src_ids = _placed(src_values, src_lengths, lengths[0], shift=0)  # (B, S)
    src_ids[every_row, src_lengths] = EOS_ID
    tgt_in = _placed(tgt_values, tgt_lengths, lengths[1], shift=1)  # (B, T)
    tgt_in[:, 0] = BOS_ID
    tgt_out = _placed(tgt_values, tgt_lengths, lengths[1], shift=0)  # (B, T)
    tgt_out[every_row, tgt_lengths] = EOS_ID
    real_rows = rows
    if empty is not None and empty.any():
        tgt_out[empty, 0] = PAD_ID
        real_rows -= int(empty.sum())
    tensors = [torch.from_numpy(array) for array in (src_ids, tgt_in, tgt_out)]
    if pin_memory:
        tensors = [tensor.pin_memory() for tensor in tensors]
    src_t, tgt_in_t, tgt_out_t = tensors
    src_padded = bool(src_lengths.min() + 1 < lengths[0])  # a row shorter than the width: keys to mask
    return Batch(
        src=src_t,
        src_mask=src_t.ne(PAD_ID),
        tgt_in=tgt_in_t,
        tgt_out=tgt_out_t,
        num_tokens=int(tgt_lengths.sum()) + real_rows,
        src_padded=src_padded,
    )


def _placed(values: np.ndarray, lengths: np.ndarray, width: int, shift: int) -> np.ndarray:
    """A (rows, width) PAD array with row r's ids (the next lengths[r] of `values`) from column `shift` on."""
    padded = np.full((len(lengths), width), PAD_ID, dtype=np.int64)
    row = np.repeat(np.arange(len(lengths)), lengths)
    column = np.arange(len(values)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + shift
    padded[row, column] = values
    return padded


def round_up(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def token_batches(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, *, batch_tokens: int, seed: int, epoch: int, max_length: int
) -> tuple[list[np.ndarray], int]:
    """Indices of each batch for one epoch, and how many pairs were skipped as too long.

    1. Shuffle with a generator seeded by (seed, epoch), then stable-sort by (target, source)
       length, so equal lengths are in a fresh random order every epoch.
    2. Cut the sorted list greedily so that sentences x longest side (+1 for EOS/BOS) stays within
       `batch_tokens`: similar lengths in one batch mean little padding.
    3. Shuffle the order of the batches.
    """
    rng = np.random.default_rng([seed, epoch])
    src_cost, tgt_cost = src_lengths + 1, tgt_lengths + 1
    keep = np.flatnonzero((src_cost <= max_length) & (tgt_cost <= max_length))
    skipped = len(src_lengths) - len(keep)
    order = keep[rng.permutation(len(keep))]
    order = order[np.lexsort((src_cost[order], tgt_cost[order]))]  # last key sorts first
    longest = np.maximum(src_cost[order], tgt_cost[order])
    batches: list[np.ndarray] = []
    start, widest = 0, 0
    for position in range(len(order)):
        widest_here = max(widest, int(longest[position]))
        if position > start and widest_here * (position - start + 1) > batch_tokens:
            batches.append(order[start:position])
            start, widest_here = position, int(longest[position])
        widest = widest_here
    if start < len(order):
        batches.append(order[start:])
    return [batches[i] for i in rng.permutation(len(batches))], skipped


class CorpusMix:
    """Which training pairs each epoch draws from each corpus, by the recipe's weights.

    Corpus c (its pairs marked c in the prepared `corpus` column) gives round(weight x size) pairs
    an epoch: every pair floor(weight) times, plus a random share of the rest drawn afresh each
    epoch from (seed, epoch). A weight of 2.0 doubles a corpus; 0.1 keeps a tenth of it.
    """

    def __init__(self, corpus: np.ndarray, weights: list[float], *, names: list[str], temperature: float | None = None) -> None:
        self.corpus = corpus  # each pair's corpus index
        self.members = [np.flatnonzero(corpus == index) for index in range(len(weights))]
        self.names = names
        self.weights = weights if temperature is None else temperature_weights([len(m) for m in self.members], temperature)

    def draw(self, seed: int, epoch: int) -> np.ndarray:
        """The indices of the pairs this epoch trains on (repeats allowed), corpus by corpus."""
        rng = np.random.default_rng([seed, epoch, 1])
        drawn = []
        for members, weight in zip(self.members, self.weights, strict=True):
            whole, rest = divmod(round(weight * len(members)), max(len(members), 1))
            drawn += [members] * whole + [np.sort(rng.choice(members, rest, replace=False))]
        return np.concatenate(drawn)

    def counts(self, drawn: np.ndarray) -> dict[str, int]:
        """How many of the `drawn` pairs each corpus gave, by name."""
        per_corpus = np.bincount(self.corpus[drawn], minlength=len(self.names))
        return {name: int(count) for name, count in zip(self.names, per_corpus, strict=True)}


def temperature_weights(sizes: Sequence[int], temperature: float) -> list[float]:
    """`data.corpus_temperature`: corpus weights that draw pairs in proportion to size^(1/T), as many pairs an epoch in all.

    Corpus c gives N x n_c^(1/T) / sum(n^(1/T)) pairs (N = all pairs): T = 1 keeps the sizes, a larger
    T flattens them (T = 5 gives a corpus 5x larger only 5^(1/5) = 1.38x the pairs).
    """
    shares = np.array([size ** (1.0 / temperature) if size else 0.0 for size in sizes])
    wanted = sum(sizes) * shares / shares.sum()
    return [float(want / size) if size else 1.0 for want, size in zip(wanted, sizes, strict=True)]


def epoch_batches(
    mix: CorpusMix,
    ids: ParallelIds,
    *,
    batch_tokens: int,
    seed: int,
    epoch: int,
    max_length: int,
    lengths: np.ndarray | None = None,
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """One epoch's batches of pair indices (the corpora drawn by weight, cut by `token_batches`, or by
    `bucket_batches` into buckets of these `lengths`: -1 marks an empty row), the draw, the pairs skipped."""
    drawn = mix.draw(seed, epoch)
    src_lengths, tgt_lengths = ids.src.lengths[drawn], ids.tgt.lengths[drawn]
    if lengths is None:
        batches, skipped = token_batches(
            src_lengths, tgt_lengths, batch_tokens=batch_tokens, seed=seed, epoch=epoch, max_length=max_length
        )
        return [drawn[batch] for batch in batches], drawn, skipped
    batches, skipped = bucket_batches(
        src_lengths, tgt_lengths, lengths=lengths, batch_tokens=batch_tokens, seed=seed, epoch=epoch, max_length=max_length
    )
    return [np.where(batch >= 0, drawn[batch], -1) for batch in batches], drawn, skipped


@dataclass(kw_only=True)
class Epoch:
    """One epoch of training: the pairs' ids as segmented for it, this rank's batches and what was drawn."""

    ids: ParallelIds
    batches: list[np.ndarray]  # sentence indices into `ids`, in training order
    corpus_pairs: dict[str, int]  # pairs drawn from each corpus (all ranks together)
    skipped: int  # drawn pairs too long for the model
    direction_pairs: dict[str, int] = field(default_factory=dict)  # pairs drawn for each direction, "de-en"
    shapes: int = 0  # with `train.shapes`: the distinct (rows, length) shapes of the epoch's batches (all ranks)
    padding: float = 0.0  # with `train.shapes`: the share of the batches' positions (both sides) that are padding


class TrainingData:
    """The prepared training pairs and their order: each epoch's segmentation, corpus draw and batches."""

    def __init__(self, config: Config, tokenizers: TokenizerPair) -> None:
        data_path, corpora = config.data_path, config.data.train
        split = load_prepared(data_path, "train")
        self.ids = ParallelIds(split)
        names = corpus_names(corpora)
        weights = [source.weight for source in corpora]
        self.mix = CorpusMix(
            corpus_column(data_path, split, names=names), weights, names=names, temperature=config.data.corpus_temperature
        )
        self.directions = [direction(config, source) for source in corpora]
        # each pair's tags, from its corpus: its target language's (a tagged recipe), then its own (`tag`)
        keys = [recipe_key(config.data, "train", index=i) for i in range(len(corpora))]
        prefixes = [corpus_tag(config, tokenizers, split=source, key=key) for source, key in zip(corpora, keys, strict=True)]
        tags = None if not any(prefixes) else [prefixes[corpus] for corpus in self.mix.corpus.tolist()]
        codes = [corpus_lead(config, tokenizers, split=source, key=key) for source, key in zip(corpora, keys, strict=True)]
        leads = None if not any(codes) else [codes[corpus] for corpus in self.mix.corpus.tolist()]
        alpha, self.seed = config.tokenizer.sampling_alpha, config.train.seed
        self.sampled = SampledIds(split, tokenizers, alpha=alpha, seed=self.seed, tags=tags, leads=leads) if alpha > 0 else None
        self.batch_tokens = config.train.batch_tokens
        self._buckets: tuple[tuple[int, int], np.ndarray] | None = None

    def bucket_lengths(self, shapes: int, max_length: int) -> np.ndarray:
        """The padded lengths of `shapes` buckets (`train.shapes`), the same every epoch: chosen for the
        prepared pairs as the corpus weights draw them. With subword sampling, whose pieces can make a
        pair longer than any prepared one, one of them is min(max_length, batch_tokens)."""
        if self._buckets is None or self._buckets[0] != (shapes, max_length):
            cost = np.maximum(self.ids.src.lengths, self.ids.tgt.lengths) + 1
            fits = cost <= max_length
            weights = np.asarray(self.mix.weights)[self.mix.corpus[fits]]
            top = [min(max_length, self.batch_tokens)] if self.sampled is not None else []
            chosen = bucket_lengths(cost[fits], weights, shapes=shapes - len(top), batch_tokens=self.batch_tokens)
            self._buckets = ((shapes, max_length), np.union1d(chosen, top).astype(np.int64))
        return self._buckets[1]

    def epoch(self, epoch: int, max_length: int, *, rank: int = 0, world_size: int = 1, shapes: int = 0) -> Epoch:
        """Epoch `epoch` (the same every time it is asked for); under torchrun, this rank's equal share.
        `shapes` (`train.shapes`, 0: off): the same pairs in batches of at most that many shapes."""
        ids = self.sampled.for_epoch(epoch) if self.sampled is not None else self.ids
        lengths = self.bucket_lengths(shapes, max_length) if shapes else None
        batches, drawn, skipped = epoch_batches(
            self.mix, ids, batch_tokens=self.batch_tokens, seed=self.seed, epoch=epoch, max_length=max_length, lengths=lengths
        )
        if not batches:
            raise MtkitError(
                f"no training pair fits the model: all {skipped} need more than model.max_positions={max_length} "
                "positions (pieces + EOS); raise model.max_positions, or lower data.max_len and prepare again"
            )
        shape_count, padding = 0, 0.0
        if lengths is not None:
            shape_count, padding = shapes_and_padding(batches, ids.src.lengths, tgt_lengths=ids.tgt.lengths, lengths=lengths)
            ids = BucketedIds(ids, lengths)
        if world_size > 1:  # a disjoint, equally long share of the epoch for each rank
            usable = len(batches) // world_size * world_size
            batches = batches[rank:usable:world_size]
        counts = self.mix.counts(drawn)
        per_direction: dict[str, int] = {}
        for name, way in zip(self.mix.names, self.directions, strict=True):
            per_direction[way] = per_direction.get(way, 0) + counts[name]
        return Epoch(
            ids=ids,
            batches=batches,
            corpus_pairs=counts,
            skipped=skipped,
            direction_pairs=per_direction,
            shapes=shape_count,
            padding=padding,
        )
