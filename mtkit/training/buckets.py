"""Length buckets (`train.shapes`): each epoch's drawn pairs grouped into batches of at most K shapes.

Token-budget batches (`batches.token_batches`) are each padded to their own longest pair: about a
hundred shapes an epoch, each a new graph for a compiled step and a CUDA graph that cannot be reused.
Here every pair goes to the shortest of K bucket lengths that holds it; a batch of bucket length L
has `max(1, batch_tokens // L)` rows (the token budget holds) and both sides padded to L, so a
batch's shape (rows, L, L) is one of K. A bucket's last batch is filled with empty rows (index -1):
a source of one EOS and a target of PAD only, which add nothing to the loss or the token count.

The bucket lengths come from the prepared pairs and the corpus weights, not from an epoch's draw,
so every epoch has the same K shapes; a pair longer than every bucket (subword sampling can lengthen
one past the prepared longest) is batched alone at its own length.
"""

from __future__ import annotations

import numpy as np


def bucket_lengths(costs: np.ndarray, weights: np.ndarray, *, shapes: int, batch_tokens: int) -> np.ndarray:
    """The at most `shapes` padded lengths, longest = max(`costs`), that spend the fewest positions on
    pairs of these costs (each counted `weights` times, its corpus weight: how often an epoch draws it).

    A pair padded to L costs batch_tokens / rows(L) positions (the rows' share of the budget, so a
    length that wastes part of the budget by rounding its rows down counts that too), and each bucket
    half a batch (its last batch's empty rows, on average); dynamic programming over the distinct
    costs finds the cheapest buckets exactly: fewer than K where another would cost more than it saves.
    """
    if shapes < 1 or len(costs) == 0:
        return np.zeros(0, dtype=np.int64)
    values, inverse = np.unique(costs, return_inverse=True)
    weight = np.bincount(inverse, weights=weights, minlength=len(values))
    before = np.concatenate([[0.0], np.cumsum(weight)])  # before[j]: the weight of values[:j]
    per_pair = batch_tokens / np.maximum(1, batch_tokens // values)  # positions one pair padded to values[j] costs
    count = len(values)
    # best[j]: the least cost of values[:j+1] with its last bucket ending at values[j] (k buckets at most)
    last_batch = batch_tokens / 2
    best = per_pair * before[1:] + last_batch
    starts = []  # starts[k][j]: the last bucket's first value index for k+2 buckets, -1 when fewer buckets were better
    later = np.triu(np.ones((count, count), dtype=bool), k=1)  # (i, j): i < j, bucket (values[i], values[j]]
    for _ in range(min(shapes, count) - 1):
        # 1. cost[i, j]: the best up to values[i], then one bucket (values[i], values[j]]
        added = per_pair[None, :] * (before[None, 1:] - before[1:, None]) + last_batch
        cost = np.where(later, best[:, None] + added, np.inf)
        previous = cost.argmin(axis=0)  # (count,)
        split = cost[previous, np.arange(count)]
        # 2. one bucket more only where it is cheaper
        starts.append(np.where(split < best, previous, -1))
        best = np.minimum(best, split)
    return values[_bucket_ends(starts, count)]


def _bucket_ends(starts: list[np.ndarray], count: int) -> np.ndarray:
    """The value indices the buckets end at, traced back from the last value through `starts`."""
    ends, end = [count - 1], count - 1
    for start in reversed(starts):
        if start[end] >= 0:
            end = int(start[end])
            ends.append(end)
    return np.array(ends[::-1])


def bucket_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    *,
    lengths: np.ndarray,
    batch_tokens: int,
    seed: int,
    epoch: int,
    max_length: int,
) -> tuple[list[np.ndarray], int]:
    """Indices of each batch for one epoch (-1: an empty row), and how many pairs were skipped as too long.

    The same pairs as `token_batches` (the same skipping by `max_length`), grouped by bucket:
    1. Shuffle with a generator seeded by (seed, epoch).
    2. Put each pair in the shortest bucket whose length holds its longer side (+1 for EOS/BOS).
    3. Cut each bucket into batches of its rows, the last filled with empty rows.
    4. Shuffle the order of the batches.
    """
    rng = np.random.default_rng([seed, epoch])
    cost = np.maximum(src_lengths, tgt_lengths) + 1
    keep = np.flatnonzero(cost <= max_length)
    skipped = len(cost) - len(keep)
    order = keep[rng.permutation(len(keep))]
    bucket = np.searchsorted(lengths, cost[order])  # len(lengths): longer than every bucket
    batches: list[np.ndarray] = []
    for index, length in enumerate(lengths):
        members = order[bucket == index]
        rows = max(1, batch_tokens // int(length))
        filled = np.concatenate([members, np.full(-len(members) % rows, -1, dtype=members.dtype)])
        batches += list(filled.reshape(-1, rows))
    batches += list(order[bucket == len(lengths)].reshape(-1, 1))
    return [batches[i] for i in rng.permutation(len(batches))], skipped


def batch_length(lengths: np.ndarray, longest: int) -> int:
    """The padded length of a batch whose longest pair needs `longest` positions: its bucket's, or its own beyond them."""
    bucket = int(np.searchsorted(lengths, longest))
    return int(lengths[bucket]) if bucket < len(lengths) else longest


def shapes_and_padding(
    batches: list[np.ndarray], src_lengths: np.ndarray, *, tgt_lengths: np.ndarray, lengths: np.ndarray
) -> tuple[int, float]:
    """How many distinct (rows, length) shapes `batches` have, and the share of their positions (both sides) that are padding."""
    shapes, positions, real = set(), 0, 0
    for batch in batches:
        pairs = batch[batch >= 0]
        length = batch_length(lengths, int(np.maximum(src_lengths[pairs], tgt_lengths[pairs]).max()) + 1)
        shapes.add((len(batch), length))
        positions += 2 * len(batch) * length
        real += int(src_lengths[pairs].sum() + tgt_lengths[pairs].sum()) + 2 * len(pairs)
    return len(shapes), 1 - real / max(positions, 1)
