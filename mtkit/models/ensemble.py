"""An ensemble of translation models behind the same encode / decode / reorder_state contract.

At every step the members' next-token log-probabilities are averaged, so search, scoring and
alignments drive an ensemble exactly as they drive one model. Each member keeps its own decoder
state (its keys are prefixed with the member's number) and its own memory: the ensemble's memory
is the members' memories side by side along the feature axis, so search can select and reorder
its rows like any other memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from mtkit.data.tokenizer import Tokenizer, TokenizerPair
from mtkit.errors import MtkitError
from mtkit.models.base import DecoderState, EncoderDecoder, OutputRows


class Ensemble(EncoderDecoder):
    """Members' log-probabilities averaged; `decode` returns those averages as its logits."""

    def __init__(self, members: Sequence[EncoderDecoder]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        self._widths = [_memory_width(member) for member in members]  # memory features of each member

    @property
    def max_positions(self) -> int:
        return min(member.max_positions for member in self.members)

    @property
    def attention_layers(self) -> int:
        return min(member.attention_layers for member in self.members)

    @property
    def memory_per_sentence(self) -> bool:  # type: ignore[override]
        return all(member.memory_per_sentence for member in self.members)

    def encode(self, src: Tensor, src_mask: Tensor, *, src_padded: bool | None = None) -> Tensor:
        """src (B, S) -> the members' memories concatenated, (B, S, D_1 + ... + D_M)."""
        return torch.cat([member.encode(src, src_mask, src_padded=src_padded) for member in self.members], dim=-1)

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
        """The mean of the members' log-probabilities (B, T, V), or (B, T, V') over `output_rows`, and every member's state."""
        log_probs = []
        cut = {} if output_rows is None else {"output_rows": output_rows}  # each member's own output layer, cut
        for number, (member, part) in enumerate(zip(self.members, self._split(memory), strict=True)):
            own = None if state is None else _member_state(state, number)
            logits, own = member.decode(tgt, part, src_mask=src_mask, state=own, src_padded=src_padded, **cut)
            log_probs.append(torch.log_softmax(logits.float(), dim=-1))
            if state is not None and own is not None:
                state.update({f"{number}:{key}": value for key, value in own.items()})
        return torch.stack(log_probs).mean(dim=0), state

    def cross_attention(self, tgt: Tensor, memory: Tensor, *, src_mask: Tensor, layer: int = -1) -> Tensor:
        """(B, M, T, S): each member's weights in `layer`, averaged over its heads, one panel per member."""
        parts = self._split(memory)
        weights = [
            member.cross_attention(tgt, part, src_mask=src_mask, layer=layer).float().mean(dim=1)  # (B, T, S)
            for member, part in zip(self.members, parts, strict=True)
        ]
        return torch.stack(weights, dim=1)

    def _split(self, memory: Tensor) -> list[Tensor]:
        return list(torch.split(memory, self._widths, dim=-1))


@torch.inference_mode()
def _memory_width(member: EncoderDecoder) -> int:
    """The feature size of a member's memory, found by encoding one token."""
    device = next(member.parameters()).device
    src = torch.ones((1, 1), dtype=torch.long, device=device)
    return member.encode(src, torch.ones_like(src, dtype=torch.bool)).size(-1)


def _member_state(state: DecoderState, number: int) -> DecoderState:
    """Member `number`'s own view of the shared state dict (keys without the prefix)."""
    prefix = f"{number}:"
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


def check_same_vocabularies(paths: Sequence[Path], tokenizers: Sequence[TokenizerPair]) -> None:
    """One clear error unless every model reads and writes the first model's pieces."""
    first = tokenizers[0]
    for path, pair in zip(paths[1:], tokenizers[1:], strict=True):
        for side, mine, theirs in (("target", pair.tgt, first.tgt), ("source", pair.src, first.src)):
            if _pieces(mine) != _pieces(theirs):
                raise MtkitError(
                    f"{path}: its {side} vocabulary differs from {paths[0]}'s; an ensemble needs models trained "
                    "with the same tokenizer (the same data_dir, or a copy of its tokenizer files)"
                )


def _pieces(tokenizer: Tokenizer) -> list[str]:
    return tokenizer.id_to_piece(range(tokenizer.vocab_size))
