"""The decoder's self-attention cache grows in place: a step is written into its buffer's room, not concatenated,
and reordering the batch keeps the room; the values are exactly those of concatenation and index_select."""

from __future__ import annotations

import torch

from mtkit.models import kv_cache
from mtkit.models.kv_cache import appended, reordered, room


def steps(count: int, *, batch: int = 3, length: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(count)
    return [torch.randn(batch, 2, length, 4, generator=generator) for _ in range(count)]


def test_steps_are_written_into_the_room_and_read_back_as_concatenation_gives_them():
    new = steps(kv_cache.ROOM + 3)
    entry = appended(None, new[0])
    first = entry.data_ptr()
    for count, step in enumerate(new[1:], start=2):
        entry = appended(entry, step)
        assert torch.equal(entry, torch.cat(new[:count], dim=2))
        if count <= kv_cache.ROOM + 1:  # the first buffer's room
            assert entry.data_ptr() == first
    assert entry.data_ptr() != first  # the room used up: a new buffer, with room again
    assert room(entry) == kv_cache.ROOM - 1  # made for step ROOM + 2, then one more written


def test_a_reordered_cache_keeps_its_room_and_its_rows_are_index_selects():
    entry = appended(appended(None, steps(1)[0]), steps(2)[1])
    order = torch.tensor([2, 2, 0, 1])
    moved = reordered(entry, order)
    assert torch.equal(moved, entry.index_select(0, order))
    assert room(moved) == room(entry) > 0
    after = appended(moved, torch.ones(4, 2, 1, 4))
    assert after.data_ptr() == moved.data_ptr() and torch.equal(after[:, :, :2], entry.index_select(0, order))


def test_a_tensor_made_elsewhere_has_no_room_and_is_concatenated():
    plain = torch.randn(3, 2, 5, 4)
    transposed = torch.randn(3, 5, 2, 4).transpose(1, 2)  # the projection's keys before caching
    assert room(plain) == room(transposed) == room(torch.randn(3, 4)) == room(torch.empty(0, 2, 5, 4)) == 0
    step = torch.randn(3, 2, 1, 4)
    assert torch.equal(appended(transposed, step), torch.cat([transposed, step], dim=2))
    assert torch.equal(reordered(plain, torch.tensor([1, 0])), plain.index_select(0, torch.tensor([1, 0])))


def test_several_new_positions_at_once_fill_the_room_or_move_to_a_new_buffer():
    start = appended(None, steps(1, length=3)[0])
    more = steps(2, length=kv_cache.ROOM)[1]
    grown = appended(start, more)
    assert grown.data_ptr() == start.data_ptr() and torch.equal(grown, torch.cat([start, more], dim=2))
    over = appended(grown, torch.zeros(3, 2, 1, 4))
    assert over.data_ptr() != grown.data_ptr() and over.size(2) == 3 + kv_cache.ROOM + 1


def test_a_reorder_in_place_moves_only_the_changed_rows_within_the_same_buffer():
    entry = appended(appended(None, steps(1, batch=4)[0]), steps(2, batch=4)[1])
    order = torch.tensor([0, 0, 3, 2])  # row 0 kept, row 1 takes row 0, rows 2 and 3 swap
    expected = entry.index_select(0, order)
    to, source = kv_cache.moves(order)
    assert to.tolist() == [1, 2, 3] and source.tolist() == [0, 3, 2]
    moved = reordered(entry, order, in_place=(to, source))
    assert moved.data_ptr() == entry.data_ptr() and room(moved) == room(entry) > 0
    assert torch.equal(moved, expected)
    shrunk = reordered(moved, torch.tensor([3, 1]), in_place=kv_cache.moves(torch.tensor([3, 1])))  # another batch size
    assert shrunk.data_ptr() != moved.data_ptr() and torch.equal(shrunk, expected[[3, 1]])
