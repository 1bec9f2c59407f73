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
from mtkit.data.prepare import corpus_tag
from mtkit.data.store import corpus_column, load_prepared
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tag, TokenizerPair, seed_sampling, tagged
from mtkit.errors import MtkitError


@dataclass
class Batch:
    src: Tensor  # (B, S) source ids + EOS
    src_mask: Tensor  # (B, S) bool, True on real tokens
    tgt_in: Tensor  # (B, T) BOS + target ids
    tgt_out: Tensor  # (B, T) target ids + EOS
    num_tokens: int  # real (non-pad) tokens in tgt_out

    def to(self, device: torch.device) -> Batch:
        """On `device` (itself when already there); to a GPU the ids are copied without blocking (from pinned
        memory when `collate` pinned them) and the mask is computed there."""
        if self.src.device == device:
            return self
        non_blocking = device.type == "cuda"
        src = self.src.to(device, non_blocking=non_blocking)
        tgt_in, tgt_out = (ids.to(device, non_blocking=non_blocking) for ids in (self.tgt_in, self.tgt_out))
        return Batch(src, src.ne(PAD_ID), tgt_in, tgt_out, self.num_tokens)


class IdColumn:
    """A list<int32> Arrow column as flat values + offsets, without copying into Python lists."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        self.offsets = array.offsets.to_numpy()
        self.values = array.values.to_numpy(zero_copy_only=False)
        self.lengths = np.diff(self.offsets)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]


class ParallelIds:
    """Source and target ids of one prepared split (a `datasets.Dataset` with src_ids/tgt_ids)."""

    def __init__(self, dataset) -> None:  # dataset: datasets.Dataset
        table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
        self.src = IdColumn(table.column("src_ids"))
        self.tgt = IdColumn(table.column("tgt_ids"))

    @classmethod
    def of(cls, src: IdColumn, tgt: IdColumn) -> ParallelIds:
        ids = cls.__new__(cls)
        ids.src, ids.tgt = src, tgt
        return ids

    def __len__(self) -> int:
        return len(self.src.lengths)

    def collate(self, indices: np.ndarray, pin_memory: bool = False, length_multiple: int = 1) -> Batch:
        return collate([self.src[i] for i in indices], [self.tgt[i] for i in indices], pin_memory, length_multiple)


class SampledIds:
    """Subword regularisation: the training pairs' text re-segmented by SentencePiece sampling, once per epoch.

    The segmentation of epoch e depends only on (seed, e), so a resumed run sees the same pieces.
    Encoding runs on one thread (SentencePiece's sampling repeats only then), every epoch: its cost
    grows with the corpus (docs/performance.md).
    """

    def __init__(
        self, dataset, tokenizers: TokenizerPair, alpha: float, seed: int, tags: Sequence[Tag] | None = None
    ) -> None:  # dataset: datasets.Dataset; tags: each pair's tags (None: untagged)
        table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
        self.src_text, self.tgt_text = table.column("src").to_pylist(), table.column("tgt").to_pylist()
        self.tokenizers, self.alpha, self.seed, self.tags = tokenizers, alpha, seed, tags
        self._cached: tuple[int, ParallelIds] | None = None

    def for_epoch(self, epoch: int) -> ParallelIds:
        """The ids of every training pair as segmented for `epoch` (the same call twice gives the same ids)."""
        if self._cached is None or self._cached[0] != epoch:
            seed_sampling(self.seed * 1_000_003 + epoch)
            src = tagged(self.tokenizers.src.sample_batch(self.src_text, self.alpha), self.tags)
            tgt = self.tokenizers.tgt.sample_batch(self.tgt_text, self.alpha)
            column = pa.list_(pa.int32())
            self._cached = (epoch, ParallelIds.of(IdColumn(pa.array(src, column)), IdColumn(pa.array(tgt, column))))
        return self._cached[1]


def collate(src_ids: list, tgt_ids: list, pin_memory: bool = False, length_multiple: int = 1) -> Batch:
    """Pad one batch of id sequences into the teacher-forcing tensors, each length rounded up to a
    multiple of `length_multiple` (`train.length_multiple`: fewer shapes for a compiled step)."""
    batch = len(src_ids)
    src_len = round_up(max(len(s) for s in src_ids) + 1, length_multiple)
    tgt_len = round_up(max(len(t) for t in tgt_ids) + 1, length_multiple)
    src = np.full((batch, src_len), PAD_ID, dtype=np.int64)
    tgt_in = np.full((batch, tgt_len), PAD_ID, dtype=np.int64)
    tgt_out = np.full((batch, tgt_len), PAD_ID, dtype=np.int64)
    for row, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        src[row, : len(s)] = s
        src[row, len(s)] = EOS_ID
        tgt_in[row, 0] = BOS_ID
        tgt_in[row, 1 : len(t) + 1] = t
        tgt_out[row, : len(t)] = t
        tgt_out[row, len(t)] = EOS_ID
    src_t, tgt_in_t, tgt_out_t = (torch.from_numpy(a) for a in (src, tgt_in, tgt_out))
    if pin_memory:
        src_t, tgt_in_t, tgt_out_t = src_t.pin_memory(), tgt_in_t.pin_memory(), tgt_out_t.pin_memory()
    num_tokens = int(sum(len(t) + 1 for t in tgt_ids))
    return Batch(src_t, src_t.ne(PAD_ID), tgt_in_t, tgt_out_t, num_tokens)


def round_up(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def token_batches(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, batch_tokens: int, seed: int, epoch: int, max_length: int
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

    def __init__(self, corpus: np.ndarray, weights: list[float], names: list[str], temperature: float | None = None) -> None:
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
    mix: CorpusMix, ids: ParallelIds, batch_tokens: int, seed: int, epoch: int, max_length: int
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """One epoch's batches of pair indices (the corpora drawn by weight, cut by `token_batches`), the draw, the pairs skipped."""
    drawn = mix.draw(seed, epoch)
    batches, skipped = token_batches(ids.src.lengths[drawn], ids.tgt.lengths[drawn], batch_tokens, seed, epoch, max_length)
    return [drawn[batch] for batch in batches], drawn, skipped


@dataclass
class Epoch:
    """One epoch of training: the pairs' ids as segmented for it, this rank's batches and what was drawn."""

    ids: ParallelIds
    batches: list[np.ndarray]  # sentence indices into `ids`, in training order
    corpus_pairs: dict[str, int]  # pairs drawn from each corpus (all ranks together)
    skipped: int  # drawn pairs too long for the model
    direction_pairs: dict[str, int] = field(default_factory=dict)  # pairs drawn for each direction, "de-en"


class TrainingData:
    """The prepared training pairs and their order: each epoch's segmentation, corpus draw and batches."""

    def __init__(self, config: Config, tokenizers: TokenizerPair) -> None:
        data_path, corpora = config.data_path, config.data.train
        split = load_prepared(data_path, "train")
        self.ids = ParallelIds(split)
        names = corpus_names(corpora)
        weights = [source.weight for source in corpora]
        self.mix = CorpusMix(corpus_column(data_path, split, names), weights, names, config.data.corpus_temperature)
        self.directions = [direction(config, source) for source in corpora]
        # each pair's tags, from its corpus: its target language's (a tagged recipe), then its own (`tag`)
        prefixes = [
            corpus_tag(config, tokenizers, source, recipe_key(config.data, "train", i)) for i, source in enumerate(corpora)
        ]
        tags = None if not any(prefixes) else [prefixes[corpus] for corpus in self.mix.corpus.tolist()]
        alpha, self.seed = config.tokenizer.sampling_alpha, config.train.seed
        self.sampled = SampledIds(split, tokenizers, alpha, self.seed, tags) if alpha > 0 else None
        self.batch_tokens = config.train.batch_tokens

    def epoch(self, epoch: int, max_length: int, rank: int = 0, world_size: int = 1) -> Epoch:
        """Epoch `epoch` (the same every time it is asked for); under torchrun, this rank's equal share."""
        ids = self.sampled.for_epoch(epoch) if self.sampled is not None else self.ids
        batches, drawn, skipped = epoch_batches(self.mix, ids, self.batch_tokens, self.seed, epoch, max_length)
        if not batches:
            raise MtkitError(
                f"no training pair fits the model: all {skipped} need more than model.max_positions={max_length} "
                "positions (pieces + EOS); raise model.max_positions, or lower data.max_len and prepare again"
            )
        if world_size > 1:  # a disjoint, equally long share of the epoch for each rank
            usable = len(batches) // world_size * world_size
            batches = batches[rank:usable:world_size]
        counts = self.mix.counts(drawn)
        per_direction: dict[str, int] = {}
        for name, way in zip(self.mix.names, self.directions, strict=True):
            per_direction[way] = per_direction.get(way, 0) + counts[name]
        return Epoch(ids, batches, counts, skipped, per_direction)
