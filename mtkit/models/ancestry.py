"""Beam search without copying the self-attention cache: each beam's keys stay in the row that computed them.

Reordering the beams of a sentence (`reorder_state(..., keep_memory=True)`) would copy every layer's cached keys
and values at every step, which at NLLB's size costs more than the attention that reads them. Instead the
Transformer keeps each row's cache where it was written and reorders a small `ancestry` (B, K, t) bool: for row r
of sentence a (rows a*K .. a*K + K - 1), ancestry[r, j, τ] says whether row a*K + j holds at position τ the key of
row r's hypothesis (exactly one j does). The self-attention then reads the K rows of a sentence at once, each
query masked to its own ancestors (`SelfAttention`), which reads each key once a sentence instead of copying it.

The ancestry lives in the state under `ANCESTRY` from beam search's first reorder of its beams. Any other reorder
(sentences leaving the batch), or a step of several positions, first gathers the cache back into ordinary rows
(`materialized`), so the rest of the contract never sees an ancestry.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from mtkit.models.base import DecoderState, memory_entry
from mtkit.models.kv_cache import buffered, reordered

ANCESTRY = "ancestry"


def step_entry(key: str) -> bool:
    """Whether a cached entry holds the decoder's own keys or values, one position a step (`3.self_k`)."""
    return re.split(r"[.:]", key)[-1] in ("self_k", "self_v")


def beams_of(state: DecoderState, order: Tensor, *, keep_memory: bool) -> int:
    """The beams a sentence has when `order` only moves rows among a sentence's beams, in a batch that keeps its
    size and holds its memory entries one row a sentence; 0 for any other reorder."""
    if not keep_memory or not state:
        return 0
    batch = max(value.size(0) for value in state.values())
    sentences = [value.size(0) for key, value in state.items() if memory_entry(key)]
    if order.numel() != batch or not sentences or min(sentences) == batch or batch % min(sentences):
        return 0
    return batch // min(sentences)


def with_ancestry(state: DecoderState, order: Tensor, *, beams: int) -> DecoderState:
    """`state` reordered by `order` (rows among each sentence's `beams` rows): the memory entries and the cached
    keys and values stay where they are, the ancestry is reordered (made first when there is none)."""
    ancestry = state.get(ANCESTRY)
    if ancestry is None:
        length = next((value.size(2) for key, value in state.items() if step_entry(key)), 0)
        ancestry = _own_rows(order.numel(), beams, length, device=order.device)
    kept = {key: value for key, value in state.items() if memory_entry(key) or step_entry(key)}
    rest = {key: reordered(value, order) for key, value in state.items() if key not in kept and key != ANCESTRY}
    return {**kept, **rest, ANCESTRY: ancestry.index_select(0, order)}


def sentences_kept(state: DecoderState, order: Tensor) -> DecoderState | None:
    """`state` with an ancestry reordered by `order` when `order` keeps whole sentences (each K rows of it move among
    one sentence's beams, as when beam search drops finished sentences): each kept sentence's rows are copied as
    they are, its ancestry reordered. None for a state without an ancestry or any other order."""
    ancestry = state.get(ANCESTRY)
    if ancestry is None or order.numel() % ancestry.size(1):
        return None
    beams = ancestry.size(1)
    blocks = order.view(-1, beams).div(beams, rounding_mode="floor")  # (A', K) the sentence of each row
    if not bool(blocks.eq(blocks[:, :1]).all()):
        return None
    rows = (blocks[:, :1] * beams + torch.arange(beams, device=order.device)).flatten()  # each kept sentence's rows
    sentences = blocks[:, 0]
    out = {}
    for key, value in state.items():
        if memory_entry(key):
            out[key] = value.index_select(0, sentences if value.size(0) < ancestry.size(0) else order)
        else:
            out[key] = reordered(value, rows if step_entry(key) else order)
    return out


def grown(state: DecoderState, steps: int) -> None:
    """The ancestry of `state` (if any) extended by `steps` new positions, each written by its own row."""
    ancestry = state.get(ANCESTRY)
    if ancestry is not None:
        new = _own_rows(ancestry.size(0), ancestry.size(1), steps, device=ancestry.device)
        state[ANCESTRY] = torch.cat([ancestry, new], dim=2)


def materialized(state: DecoderState) -> DecoderState:
    """`state` with its cached keys and values gathered into each row's own hypothesis, and no ancestry: what
    reordering them by copies would have given. The state itself when it has no ancestry."""
    ancestry = state.get(ANCESTRY)
    if ancestry is None:
        return state
    rows, beams, length = ancestry.shape
    first = torch.arange(rows, device=ancestry.device).div(beams, rounding_mode="floor").mul(beams)  # (B,)
    ancestors = first.unsqueeze(1) + ancestry.int().argmax(dim=1)  # (B, t) the row holding each position
    positions = torch.arange(length, device=ancestry.device)
    out = {key: value for key, value in state.items() if key != ANCESTRY}
    for key, value in out.items():
        if step_entry(key):
            gathered = value[ancestors, :, positions].permute(0, 2, 1, 3)  # (B, H, t, Dh)
            out[key] = buffered(gathered)
    return out


def _own_rows(rows: int, beams: int, steps: int, *, device: torch.device) -> Tensor:
    """(rows, beams, steps) bool: every row holds its own positions."""
    own = torch.eye(beams, dtype=torch.bool, device=device).repeat(rows // beams, 1)  # (B, K)
    return own.unsqueeze(2).expand(rows, beams, steps)
