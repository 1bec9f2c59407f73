"""The Transformer encoder-decoder (Vaswani et al., 2017) behind the shared model contract.

Pre- or post-norm residual blocks, sinusoidal or learned positions, tied embeddings, and
incremental decoding: the decoder state caches self-attention keys/values per layer and the
cross-attention keys/values of the memory, computed once per sentence.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mtkit.models.base import DecoderState, EncoderDecoder
from mtkit.models.layers import Dropout, FeedForward, MultiHeadAttention, Residual, ScaledEmbedding, make_positions


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, ffn_dim: int, dropout: float, attention_dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, heads, attention_dropout, cross=False)
        self.feed_forward = FeedForward(d_model, ffn_dim, dropout)
        self.attention_block = Residual(d_model, dropout, pre_norm)
        self.ffn_block = Residual(d_model, dropout, pre_norm)

    def forward(self, x: Tensor, key_mask: Tensor) -> Tensor:
        """x (B, S, D); key_mask (B, 1, 1, S) bool, True on real tokens."""

        def attend(h: Tensor) -> Tensor:
            return self.self_attention.attend(*self.self_attention.project_self(h), mask=key_mask, causal=False)

        x = self.attention_block(x, attend)
        return self.ffn_block(x, self.feed_forward)


class DecoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, ffn_dim: int, dropout: float, attention_dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, heads, attention_dropout, cross=False)
        self.cross_attention = MultiHeadAttention(d_model, heads, attention_dropout, cross=True)
        self.feed_forward = FeedForward(d_model, ffn_dim, dropout)
        self.self_block = Residual(d_model, dropout, pre_norm)
        self.cross_block = Residual(d_model, dropout, pre_norm)
        self.ffn_block = Residual(d_model, dropout, pre_norm)

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor, state: DecoderState | None, prefix: str) -> Tensor:
        """x (B, T, D) new target positions; memory (B, S, D); memory_mask (B, 1, 1, S)."""
        x = self.self_block(x, lambda h: self._self_attend(h, state, prefix))
        x = self.cross_block(x, lambda h: self._cross_attend(h, memory, memory_mask, state, prefix))
        return self.ffn_block(x, self.feed_forward)

    def cross_weights(self, x: Tensor, memory: Tensor, memory_mask: Tensor) -> Tensor:
        """Cross-attention weights (B, H, T, S) of this layer for teacher-forced inputs x (B, T, D)."""
        x = self.self_block(x, lambda h: self._self_attend(h, None, ""))
        h = self.cross_block.norm(x) if self.cross_block.pre_norm else x
        query = self.cross_attention.split_heads(self.cross_attention.query(h))  # (B, H, T, Dh)
        key, _ = self.cross_attention.project_memory(memory)  # (B, H, S, Dh)
        return self.cross_attention.weights(query, key, memory_mask)

    def _self_attend(self, h: Tensor, state: DecoderState | None, prefix: str) -> Tensor:
        query, key, value = self.self_attention.project_self(h)  # (B, H, T, Dh)
        if state is None:
            return self.self_attention.attend(query, key, value, mask=None, causal=True)
        past = state.get(prefix + "self_k")
        if past is not None:
            key = torch.cat([past, key], dim=2)  # (B, H, t + T, Dh)
            value = torch.cat([state[prefix + "self_v"], value], dim=2)
        state[prefix + "self_k"], state[prefix + "self_v"] = key, value
        new, total = query.size(2), key.size(2)
        # Query i (absolute position total - new + i) may see keys up to its own position.
        mask = None if new == 1 else torch.ones(new, total, dtype=torch.bool, device=h.device).tril(total - new)
        return self.self_attention.attend(query, key, value, mask=mask, causal=False)

    def _cross_attend(self, h: Tensor, memory: Tensor, memory_mask: Tensor, state: DecoderState | None, prefix: str) -> Tensor:
        query = self.cross_attention.split_heads(self.cross_attention.query(h))  # (B, H, T, Dh)
        if state is not None and prefix + "cross_k" in state:
            key, value = state[prefix + "cross_k"], state[prefix + "cross_v"]
        else:
            key, value = self.cross_attention.project_memory(memory)  # (B, H, S, Dh)
            if state is not None:
                state[prefix + "cross_k"], state[prefix + "cross_v"] = key, value
        return self.cross_attention.attend(query, key, value, mask=memory_mask, causal=False)


class Transformer(EncoderDecoder):
    """Encoder-decoder Transformer. Plain arguments so tests can build one without a config."""

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        layers: int = 6,
        d_model: int = 512,
        heads: int = 8,
        ffn_dim: int = 2048,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        norm: str = "pre",
        positions: str = "sinusoidal",
        tie_embeddings: bool = True,
        share_vocab: bool = True,
        max_positions: int = 1024,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        pre_norm = norm == "pre"
        self.positions_kind = positions
        self.position_limit = max_positions
        self.src_embed = ScaledEmbedding(src_vocab_size, d_model, pad_id)
        share = tie_embeddings and share_vocab and src_vocab_size == tgt_vocab_size
        self.tgt_embed = self.src_embed if share else ScaledEmbedding(tgt_vocab_size, d_model, pad_id)
        self.src_positions = make_positions(positions, d_model, max_positions)
        self.tgt_positions = make_positions(positions, d_model, max_positions)
        self.dropout = Dropout(dropout)
        block = (d_model, heads, ffn_dim, dropout, attention_dropout, pre_norm)
        self.encoder_layers = nn.ModuleList(EncoderLayer(*block) for _ in range(layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(*block) for _ in range(layers))
        # Pre-norm stacks end with a LayerNorm; post-norm blocks already normalise their output.
        self.encoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = self.tgt_embed.weight
        else:
            nn.init.normal_(self.output.weight, mean=0.0, std=d_model**-0.5)

    @property
    def max_positions(self) -> int:
        return self.position_limit if self.positions_kind == "learned" else 1_000_000

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src (B, S) ids, src_mask (B, S) bool -> memory (B, S, D)."""
        x = self.dropout(self.src_embed(src) + self.src_positions(src.size(1)))
        key_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.encoder_layers:
            x = layer(x, key_mask)
        return self.encoder_norm(x)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, state: DecoderState | None = None
    ) -> tuple[Tensor, DecoderState | None]:
        """tgt (B, T) new decoder inputs -> logits (B, T, V); see `mtkit.models.base` for `state`."""
        offset = 0 if state is None or "0.self_k" not in state else state["0.self_k"].size(2)
        x = self.dropout(self.tgt_embed(tgt) + self.tgt_positions(tgt.size(1), offset))
        memory_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for index, layer in enumerate(self.decoder_layers):
            x = layer(x, memory, memory_mask, state, f"{index}.")
        return self.output(self.decoder_norm(x)), state

    def cross_attention(self, tgt: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """The last decoder layer's cross-attention weights (B, H, T, S) for teacher-forced `tgt`."""
        x = self.dropout(self.tgt_embed(tgt) + self.tgt_positions(tgt.size(1)))
        memory_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for index, layer in enumerate(self.decoder_layers[:-1]):
            x = layer(x, memory, memory_mask, None, f"{index}.")
        return self.decoder_layers[-1].cross_weights(x, memory, memory_mask)
