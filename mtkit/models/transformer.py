"""The Transformer encoder-decoder (Vaswani et al., 2017) behind the shared model contract.

Pre- or post-norm residual blocks, sinusoidal (interleaved, in halves, or fairseq's) or learned positions,
an optional LayerNorm on the embeddings (mBART's), unscaled embeddings where asked, a ReLU, GELU or swish
feed-forward, encoder and decoder depths of their own, tied embeddings, an
optional bias on the output logits, and
incremental decoding: the decoder state caches self-attention keys/values per layer and the
cross-attention keys/values of the memory, computed once per sentence. The heatmaps'
cross-attention weights come from the same decoder forward, asked for the last layer's weights.
"""

from __future__ import annotations

from functools import partial

from torch import Tensor, nn

from mtkit.models.ancestry import ANCESTRY, beams_of, grown, materialized, sentences_kept, with_ancestry
from mtkit.models.base import DecoderState, EncoderDecoder, OutputRows, project
from mtkit.models.layers import (
    CrossAttention,
    Dropout,
    FeedForward,
    Residual,
    ScaledEmbedding,
    SelfAttention,
    key_padding_bias,
    make_positions,
)


class EncoderLayer(nn.Module):
    def __init__(
        self, d_model: int, heads: int, *, ffn_dim: int, dropout: float, attention_dropout: float, pre_norm: bool, activation: str
    ) -> None:
        super().__init__()
        self.self_attention = SelfAttention(d_model, heads, dropout=attention_dropout, causal=False)
        self.feed_forward = FeedForward(d_model, ffn_dim, dropout=dropout, activation=activation)
        self.attention_block, self.ffn_block = (Residual(d_model, dropout, pre_norm=pre_norm) for _ in range(2))

    def forward(self, x: Tensor, key_bias: Tensor | None) -> Tensor:
        """x (B, S, D); key_bias (B, 1, 1, S) the padding's `key_padding_bias` (None: no padding)."""
        x = self.attention_block(x, lambda h: self.self_attention(h, key_bias))
        return self.ffn_block(x, self.feed_forward)


class DecoderLayer(nn.Module):
    def __init__(
        self, d_model: int, heads: int, *, ffn_dim: int, dropout: float, attention_dropout: float, pre_norm: bool, activation: str
    ) -> None:
        super().__init__()
        self.self_attention = SelfAttention(d_model, heads, dropout=attention_dropout, causal=True)
        self.cross_attention = CrossAttention(d_model, heads, dropout=attention_dropout)
        self.feed_forward = FeedForward(d_model, ffn_dim, dropout=dropout, activation=activation)
        self.self_block, self.cross_block, self.ffn_block = (Residual(d_model, dropout, pre_norm=pre_norm) for _ in range(3))

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_bias: Tensor | None,
        state: DecoderState | None,
        prefix: str,
        *,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D) new target positions; memory (B, S, D); memory_bias (B, 1, 1, S) or None (no padding).

        Returns (B, T, D) and, with `need_weights`, the cross-attention weights (B, H, T, S).
        """
        x = self.self_block(x, lambda h: self.self_attention(h, cache=state, prefix=prefix))
        h = self.cross_block.sublayer_input(x)
        context, weights = self.cross_attention(h, memory, memory_bias, state, prefix, need_weights=need_weights)
        x = self.cross_block.combine(x, context)
        return self.ffn_block(x, self.feed_forward), weights


class Transformer(EncoderDecoder):
    """Encoder-decoder Transformer. Plain arguments so tests can build one without a config."""

    memory_per_sentence = True  # cross-attention reads a sentence's cached keys once for all its beams

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        *,
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
        activation: str = "relu",
        encoder_layers: int = 0,
        decoder_layers: int = 0,
        output_bias: bool = False,
        embedding_norm: bool = False,
        scale_embedding: bool = True,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        pre_norm = norm == "pre"
        self.positions_kind, self.position_limit = positions, max_positions
        embedding = partial(ScaledEmbedding, d_model=d_model, pad_id=pad_id, scale=scale_embedding)
        self.src_embed = embedding(src_vocab_size)
        share = tie_embeddings and share_vocab and src_vocab_size == tgt_vocab_size
        self.tgt_embed = self.src_embed if share else embedding(tgt_vocab_size)
        self.src_positions = make_positions(positions, d_model, max_positions=max_positions)
        self.tgt_positions = make_positions(positions, d_model, max_positions=max_positions)
        # mBART's layernorm_embedding: a LayerNorm over embeddings + positions, before dropout (no parameters without it)
        self.src_embed_norm, self.tgt_embed_norm = (nn.LayerNorm(d_model) if embedding_norm else nn.Identity() for _ in range(2))
        self.dropout = Dropout(dropout)
        block = dict(ffn_dim=ffn_dim, dropout=dropout, attention_dropout=attention_dropout, activation=activation)
        block["pre_norm"] = pre_norm
        self.encoder_layers = nn.ModuleList(EncoderLayer(d_model, heads, **block) for _ in range(encoder_layers or layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(d_model, heads, **block) for _ in range(decoder_layers or layers))
        # Pre-norm stacks end with a LayerNorm; post-norm blocks already normalise their output.
        self.encoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=output_bias)
        if output_bias:
            nn.init.zeros_(self.output.bias)
        if tie_embeddings:
            self.output.weight = self.tgt_embed.weight
        else:
            nn.init.normal_(self.output.weight, mean=0.0, std=d_model**-0.5)

    @property
    def max_positions(self) -> int:
        return self.position_limit if self.positions_kind == "learned" else 1_000_000

    def vocabulary_rows(self) -> dict[str, str]:
        rows = {"src_embed.embedding.weight": "src", "tgt_embed.embedding.weight": "tgt", "output.weight": "tgt"}
        return rows | ({"output.bias": "tgt"} if self.output.bias is not None else {})

    def part_of(self, name: str) -> str:
        """Embeddings (with their positions and the tied output weight), encoder, decoder or output (its own weight, bias)."""
        top = name.split(".")[0]
        parts = {
            "src_embed": "embeddings",
            "tgt_embed": "embeddings",
            "src_positions": "embeddings",
            "tgt_positions": "embeddings",
            "src_embed_norm": "embeddings",
            "tgt_embed_norm": "embeddings",
        }
        parts |= {"encoder_layers": "encoder", "encoder_norm": "encoder", "decoder_layers": "decoder", "decoder_norm": "decoder"}
        return parts.get(top, "output")

    def encode(self, src: Tensor, src_mask: Tensor, *, src_padded: bool | None = None) -> Tensor:
        """src (B, S) ids, src_mask (B, S) bool -> memory (B, S, D)."""
        x = self.dropout(self.src_embed_norm(self.src_embed(src) + self.src_positions(src.size(1))))
        key_bias = key_padding_bias(src_mask, src_padded=src_padded, like=x)  # (B, 1, 1, S) or None, for every layer
        for layer in self.encoder_layers:
            x = layer(x, key_bias)
        return self.encoder_norm(x)

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
        """tgt (B, T) new decoder inputs -> logits (B, T, V), or (B, T, V') of `output_rows`; see `mtkit.models.base`."""
        if state is not None and ANCESTRY in state:
            if tgt.size(1) > 1:  # the ancestry's attention takes one new position a row
                state = materialized(state)
            grown(state, tgt.size(1))
        x, _ = self._run_decoder(tgt, memory, src_mask, state, src_padded=src_padded)
        return project(self.output, self.decoder_norm(x), output_rows=output_rows), state

    def reorder_state(self, state: DecoderState, order: Tensor, *, keep_memory: bool = False) -> DecoderState:
        """The contract's reorder; beam search's reordering of its beams leaves the self-attention cache where it is
        and reorders its ancestry instead (`mtkit.models.ancestry`)."""
        beams = beams_of(state, order, keep_memory=keep_memory)
        if beams:
            return with_ancestry(state, order, beams=beams)
        kept = sentences_kept(state, order)
        return kept if kept is not None else super().reorder_state(materialized(state), order, keep_memory=keep_memory)

    def final_states(self, tgt: Tensor, memory: Tensor, *, src_mask: Tensor, src_padded: bool | None = None) -> Tensor:
        """Teacher-forced tgt (B, T) -> the normalised decoder output (B, T, D) that `output` projects."""
        x, _ = self._run_decoder(tgt, memory, src_mask, None, src_padded=src_padded)
        return self.decoder_norm(x)

    @property
    def attention_layers(self) -> int:
        return len(self.decoder_layers)

    def repeated_blocks(self) -> list[nn.Module]:
        return [*self.encoder_layers, *self.decoder_layers]

    def cross_attention(self, tgt: Tensor, memory: Tensor, *, src_mask: Tensor, layer: int = -1) -> Tensor:
        """Decoder layer `layer`'s cross-attention weights (B, H, T, S) for teacher-forced `tgt`."""
        _, weights = self._run_decoder(tgt, memory, src_mask, None, weights_of=layer % len(self.decoder_layers))
        assert weights is not None
        return weights

    def _run_decoder(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        state: DecoderState | None,
        weights_of: int | None = None,
        src_padded: bool | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The decoder stack: hidden states (B, T, D) and the cross-attention weights (B, H, T, S)
        of layer `weights_of` (None: no weights)."""
        offset = 0 if state is None or "0.self_k" not in state else state["0.self_k"].size(2)
        x = self.dropout(self.tgt_embed_norm(self.tgt_embed(tgt) + self.tgt_positions(tgt.size(1), offset)))
        memory_bias = self._memory_bias(src_mask, src_padded, state, memory)
        weights = None
        for index, layer in enumerate(self.decoder_layers):
            prefix = "" if state is None else f"{index}."  # the cache's keys; no state, one call for every layer
            x, found = layer(x, memory, memory_bias, state, prefix, need_weights=index == weights_of)
            weights = found if index == weights_of else weights
        return x, weights

    @staticmethod
    def _memory_bias(src_mask: Tensor, src_padded: bool | None, state: DecoderState | None, memory: Tensor) -> Tensor | None:
        """The cross-attention's `key_padding_bias` (B, 1, 1, S), built once per sentence batch: incremental
        decoding keeps it in the state as `cross_bias` (computed from the source alone, like `cross_k`)."""
        if state is not None and "cross_bias" in state:
            return state["cross_bias"]
        bias = key_padding_bias(src_mask, src_padded=src_padded, like=memory)
        if state is not None and bias is not None:
            state["cross_bias"] = bias
        return bias
