"""The encode / decode / reorder_state contract that search and training rely on.

Every architecture implements it, so nothing outside `mtkit.models` asks which model it drives:

- `encode(src, src_mask) -> memory`
- `decode(tgt, memory, *, src_mask, state, output_rows) -> (logits, state)`
- `reorder_state(state, order) -> state`
- `final_states(tgt, memory, *, src_mask) -> states` (B, T, D), for models that train: teacher-forced
  `tgt`'s final decoder states, which the model's `output` layer (an `nn.Linear`, D -> V) turns
  into `decode`'s logits (the training loss fuses the two: `mtkit.training.fused_loss`)
- `cross_attention(tgt, memory, *, src_mask, layer=-1) -> weights` (B, H, T, S): where each target
  position of teacher-forced `tgt` looks in the source, per head, in decoder attention layer `layer`
  of `attention_layers` (for heatmaps, word alignments and tests)

Shapes: `src` (B, S) token ids, `src_mask` (B, S) bool, True on real tokens (False on padding);
`memory` (B, S, D); `tgt` (B, T) decoder input ids; `logits` (B, T, V).

`src_padded` (keyword, on `encode`, `decode`, `final_states` and `forward`) is what the caller
knows of `src_mask` without looking at it: False when no row has padding (every source of the
batch has the same length), True when some row has, None when not known. A model may skip its
padding mask when it is False (the Transformer's attention then takes no mask, and a GPU its
flash kernel); None and True give the masked computation. It is the caller's promise: batches
compute it from their lengths (`mtkit.training.batches.collate`), never from the mask (a host
sync on a GPU).

`output_rows` (keyword, on `decode`; None: every row) is a search's vocabulary shortlist (`OutputRows`): the
model computes the logits of those target ids only, (B, T, V') in their order, through `OutputRows.project` on
its `output` layer (an ensemble passes it on to each member). Search uses it; training and scoring never do.

`state` selects the decoding mode. `None` means full teacher-forced decoding of the whole prefix
`tgt` (training). A dict (start with `{}`) means incremental decoding: `tgt` holds only the new
tokens, and the returned dict caches what later steps need (keys/values, recurrent states).
Search reorders or shrinks the batch with `reorder_state`, which indexes every cached tensor
along its first (batch) dimension; entries computed from the memory alone are named `cross_*`, so
reordering the beams of each sentence can leave them as they are, and a model whose cross-attention reads one
row of them for all of a sentence's beams (`memory_per_sentence`) keeps them at one row a sentence.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from mtkit.models.kv_cache import moves, reordered
from mtkit.models.packed import PackedLinear, pack_linears

DecoderState = dict[str, Tensor]


class EncoderDecoder(nn.Module):
    """Base class for translation models; subclasses implement `encode` and `decode`."""

    output: nn.Linear  # final decoder states (D) -> logits (V)

    def encode(self, src: Tensor, src_mask: Tensor, *, src_padded: bool | None = None) -> Tensor:
        raise NotImplementedError

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor,
        state: DecoderState | None = None,
        src_padded: bool | None = None,
        output_rows: OutputRows | None = None,
    ) -> tuple[Tensor, DecoderState | None]:
        raise NotImplementedError

    def final_states(self, tgt: Tensor, memory: Tensor, *, src_mask: Tensor, src_padded: bool | None = None) -> Tensor:
        raise NotImplementedError

    def cross_attention(self, tgt: Tensor, memory: Tensor, *, src_mask: Tensor, layer: int = -1) -> Tensor:
        raise NotImplementedError

    memory_per_sentence = False  # see `reorder_state`

    def reorder_state(self, state: DecoderState, order: Tensor, *, keep_memory: bool = False) -> DecoderState:
        """Select batch rows `order` (LongTensor (B',)) of every cached tensor.

        `keep_memory`: `order` only moves rows among rows of the same source sentence (beam search reordering its
        beams, or repeating a sentence's first row for its beams), so the entries computed from the memory alone
        (`memory_entry`) are the same as before. They are kept as they are where the batch keeps its size, and where
        the model's cross-attention reads one row of them for all the rows of a sentence (`memory_per_sentence`);
        the rest of the cache is then reordered in place (the state given is no longer the caller's).

        A memory entry with fewer rows than the batch holds one row a sentence, the rows after it its beams
        (sentence by sentence); `order` then selects its rows by sentence (`memory_orders`).
        """
        batch = max((value.size(0) for value in state.values()), default=order.numel())
        if keep_memory and order.numel() == batch:
            rows = moves(order)
            return {key: value if memory_entry(key) else reordered(value, order, in_place=rows) for key, value in state.items()}
        if keep_memory and self.memory_per_sentence:
            return {key: value if memory_entry(key) else reordered(value, order) for key, value in state.items()}
        rows = memory_orders(state, order, batch=batch)
        return {
            key: value.index_select(0, rows[value.size(0)]) if memory_entry(key) else reordered(value, order)
            for key, value in state.items()
        }

    def forward(self, src: Tensor, src_mask: Tensor, tgt: Tensor, *, src_padded: bool | None = None) -> Tensor:
        """Teacher-forced logits (B, T, V) for decoder input `tgt`."""
        memory = self.encode(src, src_mask, **padding_hint(src_padded=src_padded))
        logits, _ = self.decode(tgt, memory, src_mask=src_mask, state=None, **padding_hint(src_padded=src_padded))
        return logits

    @property
    def has_cross_attention(self) -> bool:
        """Whether `cross_attention` has weights to give (an RNN without attention has none)."""
        return self.attention_layers > 0

    @property
    def attention_layers(self) -> int:
        """Decoder layers with cross-attention weights (`cross_attention`'s `layer` is one of them)."""
        return 1

    @property
    def max_positions(self) -> int:
        """Longest sequence the model accepts (source or target)."""
        return 1_000_000

    def repeated_blocks(self) -> list[nn.Module]:
        """The blocks repeated through the model, each called as a module (a Transformer's layers), which
        `train.compile: layers` compiles one by one so that each kind is traced once; [] where there are none."""
        return []

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def part_of(self, name: str) -> str:
        """The part a parameter (by its name in `named_parameters`) belongs to: embeddings, encoder, decoder or output."""
        raise NotImplementedError

    def vocabulary_rows(self) -> dict[str, str]:
        """The state-dict entries indexed by a vocabulary id, and their side ("src" or "tgt")."""
        raise NotImplementedError

    def freeze(self, parts: Iterable[str]) -> int:
        """Stop training the parameters of `parts` (see `part_of`); the number of parameters still trained."""
        frozen = set(parts)
        for name, parameter in self.named_parameters():
            if self.part_of(name) in frozen:
                parameter.requires_grad_(False)
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


class OutputRows:
    """The rows of the output layer one search computes (a vocabulary shortlist): target ids `ids` (V',).

    Each output layer it meets (one model's, or each ensemble member's) is cut to those rows once, on first
    use, and kept for the rest of the search: the object lives as long as one batch's search.
    """

    def __init__(self, ids: Tensor) -> None:
        self.ids = ids  # (V',) target ids, in the order of the logits' last axis
        self._cut: dict[int, nn.Linear] = {}

    def project(self, output: nn.Linear, x: Tensor) -> Tensor:
        """x (..., D) -> the logits (..., V') of `output` for `ids` only (bias included)."""
        cut = self._cut.get(id(output))
        if cut is None:
            cut = self._cut[id(output)] = self._rows_of(output)
        return cut(x)

    def _rows_of(self, output: nn.Linear) -> nn.Linear:
        """A copy of `output` holding the rows `ids`; packed for oneDNN as `output` is (`mtkit.models.packed`).
        Made outside inference mode, where search runs, so that packing can track its weight's version."""
        with torch.inference_mode(False), torch.no_grad():
            weight = output.weight.index_select(0, self.ids)  # (V', D)
            cut = nn.Linear(
                weight.size(1), weight.size(0), bias=output.bias is not None, device=weight.device, dtype=weight.dtype
            )
            cut.weight.copy_(weight)
            if output.bias is not None:
                cut.bias.copy_(output.bias.index_select(0, self.ids))
        if isinstance(output, PackedLinear):
            pack_linears(cut)
        return cut


def project(output: nn.Linear, x: Tensor, *, output_rows: OutputRows | None) -> Tensor:
    """The logits of decoder features x (..., D): every row of `output`, or only `output_rows`' rows."""
    return output(x) if output_rows is None else output_rows.project(output, x)


@functools.lru_cache(maxsize=1024)
def memory_entry(key: str) -> bool:
    """Whether a cached entry is computed from the memory alone: by convention its name (after any
    layer or ensemble-member prefix, `0.` or `1:`) starts with `cross_`, e.g. `3.cross_k`."""
    return re.split(r"[.:]", key)[-1].startswith("cross_")


def memory_orders(state: DecoderState, order: Tensor, *, batch: int) -> dict[int, Tensor]:
    """For each row count of `state`'s memory entries, the rows batch rows `order` take from such an entry: rows
    `order` of an entry with a row for each of the `batch` rows. An entry of fewer rows holds one row a sentence
    (`batch // rows` rows a sentence): one row for each sentence when `order` keeps whole blocks of one sentence's
    rows, as beam search does, else one row for each row of `order`."""
    found = {}
    for rows in {value.size(0) for key, value in state.items() if memory_entry(key)}:
        if rows == batch:
            found[rows] = order
            continue
        beams = batch // rows
        sentences = order.div(beams, rounding_mode="floor")  # (B',) the sentence of each row
        blocks = sentences.view(-1, beams) if order.numel() % beams == 0 else None
        whole = blocks is not None and bool(blocks.eq(blocks[:, :1]).all())
        found[rows] = blocks[:, 0] if whole else sentences
    return found


def padding_hint(*, src_padded: bool | None) -> dict[str, bool]:
    """The `src_padded` keyword, given only when known, so that a model written to the contract
    without it (the tests' hand-written stubs) is still driven."""
    return {} if src_padded is None else {"src_padded": src_padded}


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, T) ids -> (B, T) bool, True on real tokens."""
    return tokens.ne(pad_id)


def causal_mask(length: int, device: torch.device) -> Tensor:
    """(T, T) bool, True where query position i may attend key position j (j <= i)."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()
