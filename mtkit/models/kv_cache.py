"""The self-attention keys and values a decoder caches step by step, kept in buffers with room to grow.

Appending a step's keys by concatenation copies the whole cache at every step, and allocates a new buffer each
time; at NLLB's size that copying, not the arithmetic, is what a long output pays for. So a cache entry is a view
(B, H, t, Dh) of a buffer (B, H, t + room, Dh): a step is written into the room in place, and a new buffer is
made only when the room is used up, `ROOM` steps at a time. Reordering the batch (`reordered`) copies the buffer
with its room, so the next steps still write in place.

Writing in place is safe because a decoder state is owned by one search, which always goes on from the state the
last step returned (the state dict itself is updated in place by `decode`); an entry without room (any tensor
made elsewhere) is concatenated as before.
"""

from __future__ import annotations

import torch
from torch import Tensor

ROOM = 16  # decoder steps a new buffer holds beyond what it is made for


def room(entry: Tensor) -> int:
    """How many more steps the buffer under `entry` (B, H, t, Dh) holds after it; 0 for any other tensor."""
    if entry.dim() != 4 or not entry.numel() or entry.storage_offset():
        return 0
    if entry.stride(3) != 1 or entry.stride(2) != entry.size(3):
        return 0
    capacity = entry.stride(1) // entry.size(3)
    if entry.stride(1) != capacity * entry.size(3) or entry.stride(0) != entry.size(1) * entry.stride(1):
        return 0
    if entry.untyped_storage().nbytes() < entry.size(0) * entry.stride(0) * entry.element_size():
        return 0  # strides of a buffer, but not its memory
    return max(capacity - entry.size(2), 0)


def appended(past: Tensor | None, new: Tensor) -> Tensor:
    """`past` (B, H, t, Dh) with `new` (B, H, T, Dh) after it on the time axis: written into `past`'s room when it
    has enough, else into a new buffer with `ROOM` steps of room."""
    if past is None:
        return _with_room(new, new)
    length, steps = past.size(2), new.size(2)
    if room(past) < steps:
        return _with_room(past, new)
    grown = past.as_strided((*past.shape[:2], length + steps, past.size(3)), past.stride())
    grown[:, :, length:] = new
    return grown


def moves(order: Tensor) -> tuple[Tensor, Tensor]:
    """The rows a reorder by `order` (B,) of a batch of B rows changes, and the rows each takes: (to, from)."""
    to = order.ne(torch.arange(order.numel(), device=order.device)).nonzero().flatten()
    return to, order.index_select(0, to)


def reordered(entry: Tensor, order: Tensor, *, in_place: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Rows `order` of `entry` (along its first axis); a buffer's room is copied with it.

    `in_place`, `moves(order)` when `entry` is owned by the caller and no longer needed as it is: a buffer of the
    same batch is reordered where it is, copying only the rows that change, with no new memory.
    """
    spare = room(entry)
    if not spare:
        return entry.index_select(0, order)
    batch, heads, length, dim = entry.shape
    whole = entry.as_strided((batch, heads, length + spare, dim), entry.stride())  # contiguous: rows copy at once
    if in_place is not None and order.numel() == batch:
        to, source = in_place
        if to.numel():
            whole.index_copy_(0, to, whole.index_select(0, source))
        return entry
    return whole.index_select(0, order)[:, :, :length]


def buffered(entry: Tensor) -> Tensor:
    """`entry` (B, H, t, Dh) copied into a new buffer with `ROOM` steps of room."""
    return _with_room(entry, entry)


def _with_room(past: Tensor, new: Tensor) -> Tensor:
    """A new buffer holding `past` then `new` (or `new` alone when `past` is `new`), with `ROOM` steps of room."""
    parts = [new] if past is new else [past, new]
    length = sum(part.size(2) for part in parts)
    batch, heads, _, dim = new.shape
    buffer = new.new_empty(batch, heads, length + ROOM, dim)
    start = 0
    for part in parts:
        buffer[:, :, start : start + part.size(2)] = part
        start += part.size(2)
    return buffer[:, :, :length]
