"""Model building blocks: dropout, scaled embeddings, positions, self- and cross-attention, feed-forward, residual blocks."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtkit.errors import MtkitError
from mtkit.models.ancestry import ANCESTRY
from mtkit.models.base import DecoderState
from mtkit.models.kv_cache import appended

# torch.get_autocast_dtype(device_type) came with torch 2.4; before it, `attend` casts the fp32 bias per layer
_AUTOCAST_BY_DEVICE = hasattr(torch, "get_autocast_dtype")
DROPOUT_LEVELS = 1 << 16  # on CPU a value is dropped when a random 16-bit number falls below p * 65,536


class Dropout(nn.Module):
    """Inverted dropout: zero each value with probability p, scale the rest by 1 / (1 - p).

    On CPU each value's fate is one random 16-bit number, four cut from each 64-bit integer that
    torch's generator draws: torch spends its time per element drawn, not per random bit, so fewer
    draws make the mask faster (`benchmarks/ops.py`, docs/performance.md). p is rounded to a
    multiple of 1/65,536 (`self.cpu_p`) and the scale follows it, so the expectation is kept
    exactly. Elsewhere it is `F.dropout`, fused on the GPU.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise MtkitError(f"dropout {p} is not in [0, 1); set model.dropout to a rate such as 0.1")
        self.p = p
        dropped_levels = min(round(p * DROPOUT_LEVELS), DROPOUT_LEVELS - 1)
        self.cpu_p = dropped_levels / DROPOUT_LEVELS
        self.lowest_kept = dropped_levels - DROPOUT_LEVELS // 2  # on the signed 16-bit scale [-32768, 32767]

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        return x * self.cpu_keep_scale(x)

    def cpu_keep_scale(self, x: Tensor) -> Tensor:
        """A tensor like x: 0 with probability `cpu_p`, else 1 / (1 - cpu_p)."""
        count = x.numel()
        words = torch.empty((count + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), None)  # all 64 bits random
        lanes = words.view(torch.int16)[:count].view(x.shape)  # uniform over [-32768, 32767]
        keep = lanes.ge(self.lowest_kept)
        return keep.to(x.dtype).mul_(1.0 / (1.0 - self.cpu_p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


class ScaledEmbedding(nn.Module):
    """Token embeddings multiplied by sqrt(d_model), as in Vaswani et al. (2017); `scale=False` leaves them as they
    are (`model.scale_embedding: false`, fairseq's and transformers' `scale_embedding`)."""

    def __init__(self, vocab_size: int, d_model: int, *, pad_id: int, scale: bool = True) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)
        with torch.no_grad():
            self.embedding.weight[pad_id].zero_()
        self.scale = math.sqrt(d_model) if scale else 1.0

    @property
    def weight(self) -> Tensor:
        return self.embedding.weight

    def forward(self, tokens: Tensor) -> Tensor:
        return self.embedding(tokens) * self.scale  # (B, T, D)


class SinusoidalPositions(nn.Module):
    """Fixed sine/cosine position encodings; the table grows on demand for long inputs.

    `halves=False`: sine and cosine columns interleaved (Vaswani et al.), computed in float32 as
    mtkit always has; `halves=True`: the sines of every frequency, then the cosines (Marian's and
    CTranslate2's layout), computed in float64 and rounded once.
    """

    def __init__(self, d_model: int, max_positions: int, *, halves: bool = False) -> None:
        super().__init__()
        self.d_model, self.halves = d_model, halves
        self.register_buffer("table", self._table(max_positions), persistent=False)

    def _table(self, length: int) -> Tensor:
        if self.halves:
            position = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (L, 1)
            exponent = torch.arange(0, self.d_model, 2, dtype=torch.float64) / self.d_model
            angle = position / torch.pow(10000.0, exponent)  # (L, ceil(D/2))
            half = self.d_model // 2 + self.d_model % 2
            table = torch.cat([torch.sin(angle), torch.cos(angle[:, : self.d_model - half])], dim=1)
            return table.to(torch.float32)  # (L, D)
        position = torch.arange(length, dtype=torch.float32).unsqueeze(1)  # (L, 1)
        frequency = torch.exp(torch.arange(0, self.d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / self.d_model))
        table = torch.zeros(length, self.d_model)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency[: self.d_model // 2])
        return table  # (L, D)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.table.size(0):
            self.table = self._table(2 * (offset + length)).to(self.table.device)
        return self.table[offset : offset + length]  # (T, D)


class FairseqPositions(SinusoidalPositions):
    """fairseq's sinusoids (M2M-100, NLLB-200): the sines, then the cosines, of frequencies spread over half the
    dimension minus one, for positions counted from fairseq's pad id + 1 (2); tabled in float32 with the very
    operations of transformers' `M2M100SinusoidalPositionalEmbedding`, so an imported model's values are its own."""

    OFFSET = 2  # the first position of a sequence is fairseq's padding_idx + 1

    def _table(self, length: int) -> Tensor:
        half = self.d_model // 2
        step = math.log(10000) / max(half - 1, 1)
        frequency = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)
        angle = torch.arange(length + self.OFFSET, dtype=torch.int64).float().unsqueeze(1) * frequency.unsqueeze(0)
        table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)  # (L + 2, 2 * half)
        if self.d_model % 2:
            table = torch.cat([table, torch.zeros(length + self.OFFSET, 1)], dim=1)
        return table[self.OFFSET :]  # (L, D)


class LearnedPositions(nn.Module):
    """Trained position embeddings for at most `max_positions` positions."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.embedding.num_embeddings:
            raise MtkitError(
                f"sequence of {offset + length} tokens is longer than the model's learned positions "
                f"({self.embedding.num_embeddings}); shorten the input"
            )
        positions = torch.arange(offset, offset + length, device=self.embedding.weight.device)
        return self.embedding(positions)  # (T, D)


def make_positions(kind: str, d_model: int, *, max_positions: int) -> nn.Module:
    """`model.positions`: sinusoidal, sinusoidal_halves, sinusoidal_fairseq or learned."""
    if kind == "sinusoidal_fairseq":
        return FairseqPositions(d_model, max_positions)
    if kind in ("sinusoidal", "sinusoidal_halves"):
        return SinusoidalPositions(d_model, max_positions, halves=kind == "sinusoidal_halves")
    return LearnedPositions(d_model, max_positions)


def key_padding_bias(src_mask: Tensor, *, src_padded: bool | None, like: Tensor) -> Tensor | None:
    """The source padding as every attention layer takes it, built once per batch: src_mask (B, S)
    bool -> an additive bias (B, 1, 1, S), 0 on real tokens and -inf on padding, in the dtype the
    attention computes in (autocast's, else `like`'s), so no layer converts a bool mask again.

    `src_padded` False (the caller knows every row has the same length: no padding) gives None,
    which lets a GPU run flash attention; None (not known) builds the bias, as True does. Deciding
    from the mask itself would wait for the GPU in every batch.
    """
    if src_padded is False:
        return None
    kind = like.device.type
    dtype = torch.get_autocast_dtype(kind) if _AUTOCAST_BY_DEVICE and torch.is_autocast_enabled(kind) else like.dtype
    bias = torch.zeros(src_mask.shape, dtype=dtype, device=src_mask.device).masked_fill_(~src_mask, float("-inf"))
    return bias[:, None, None, :]  # (B, 1, 1, S)


class MultiHeadAttention(nn.Module):
    """What self- and cross-attention share: heads, scaled dot-product attention, output projection.

    Subclasses own the input projections and register them before `out`, so the parameter order
    (which optimizer state in checkpoints follows) is the same as in earlier versions.
    """

    def __init__(self, d_model: int, heads: int, *, dropout: float) -> None:
        super().__init__()
        if d_model % heads:
            raise MtkitError(f"model.d_model={d_model} must be divisible by model.heads={heads}")
        self.heads = heads
        self.head_dim = d_model // heads
        self.dropout = dropout

    def split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def attend(self, query: Tensor, key: Tensor, *, value: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """The fast path: fused attention that never builds the weights. mask: a bool mask (True = may
        attend) or an additive bias (`key_padding_bias`); None lets a GPU pick flash attention."""
        dropout = self.dropout if self.training else 0.0
        if mask is not None and mask.dtype != torch.bool and mask.dtype != query.dtype:
            mask = mask.to(query.dtype)  # only when the bias was built for another compute dtype
        context = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=causal)
        return self.merge_heads(context)

    def attend_with_weights(self, query: Tensor, key: Tensor, *, value: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """The same attention with explicit weights (B, H, T, S) in float32 or wider, returned before dropout.
        mask: as `attend`'s, a bool mask or an additive bias (None: every key is real)."""
        scores = query @ key.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
        dropped = F.dropout(weights, self.dropout, training=self.training)
        context = dropped.to(value.dtype) @ value  # (B, H, T, Dh)
        return self.merge_heads(context), weights

    def merge_heads(self, context: Tensor) -> Tensor:
        """context (B, H, T, Dh) -> output projection of the concatenated heads (B, T, D)."""
        batch, _, length, _ = context.shape
        context = context.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim)  # (B, T, D)
        return self.out(context)


class SelfAttention(MultiHeadAttention):
    """Self-attention with one fused query/key/value projection; causal in the decoder.

    With a `cache` (the decoder state dict) it decodes incrementally: `x` holds only the new
    positions, and their keys/values are appended to `{prefix}self_k` / `{prefix}self_v` (B, H, t, Dh), views of
    buffers with room to grow (`mtkit.models.kv_cache`).
    """

    def __init__(self, d_model: int, heads: int, *, dropout: float, causal: bool) -> None:
        super().__init__(d_model, heads, dropout=dropout)
        self.causal = causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, key_bias: Tensor | None = None, cache: DecoderState | None = None, prefix: str = "") -> Tensor:
        """x (B, T, D) -> (B, T, D). key_bias (B, 1, 1, T): `key_padding_bias` or a bool mask, True on real
        tokens (encoder only; None: no padding)."""
        batch, length, _ = x.shape
        # One view of the fused projection gives all three, each (B, H, T, Dh), as three splits would (same strides)
        qkv = self.qkv(x).view(batch, length, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
        query, key, value = qkv.unbind(0)
        if cache is None:
            return self.attend(query, key, value=value, mask=key_bias, causal=self.causal)
        key = appended(cache.get(prefix + "self_k"), key)  # (B, H, t + T, Dh), in place where its buffer has room
        value = appended(cache.get(prefix + "self_v"), value)
        cache[prefix + "self_k"], cache[prefix + "self_v"] = key, value
        ancestry = cache.get(ANCESTRY)
        if ancestry is not None:
            return self._attend_ancestors(query, key, value=value, ancestry=ancestry)
        new, total = query.size(2), key.size(2)
        # Query i (absolute position total - new + i) may see keys up to its own position; a single
        # new query may see them all, so the usual one-token step needs no mask.
        mask = None if new == 1 else torch.ones(new, total, dtype=torch.bool, device=x.device).tril(total - new)
        return self.attend(query, key, value=value, mask=mask, causal=False)

    def _attend_ancestors(self, query: Tensor, key: Tensor, *, value: Tensor, ancestry: Tensor) -> Tensor:
        """One new position a row, query (B, H, 1, Dh), over keys and values (B, H, t, Dh) left in the rows that
        computed them: the K rows of each sentence read together, each query masked to its ancestors by
        `ancestry` (B, K, t) (`mtkit.models.ancestry`). The output (B, 1, D) of attention over reordered keys."""
        rows, heads, _, dim = query.shape
        beams, length = ancestry.size(1), key.size(2)
        sentences = rows // beams
        grouped = query.reshape(sentences, beams, heads, dim).transpose(1, 2).unsqueeze(1)  # (A, 1, H, Kq, Dh)
        keys = key.view(sentences, beams, heads, length, dim)  # (A, Kk, H, t, Dh)
        scores = grouped @ keys.transpose(-2, -1) / math.sqrt(dim)  # (A, Kk, H, Kq, t)
        allowed = ancestry.view(sentences, beams, beams, length).transpose(1, 2).unsqueeze(2)  # (A, Kk, 1, Kq, t)
        scores = scores.masked_fill(~allowed, float("-inf")).permute(0, 2, 3, 1, 4)  # (A, H, Kq, Kk, t)
        weights = torch.softmax(scores.reshape(sentences, heads, beams, -1), dim=-1)  # over every row's positions
        weights = weights.view(sentences, heads, beams, beams, length).permute(0, 3, 1, 2, 4)  # (A, Kk, H, Kq, t)
        context = (weights @ value.view(sentences, beams, heads, length, dim)).sum(dim=1)  # (A, H, Kq, Dh)
        return self.merge_heads(context).view(rows, 1, -1)


class CrossAttention(MultiHeadAttention):
    """Decoder-to-encoder attention: queries from the decoder, keys/values from the memory.

    The memory's keys/values are projected once per sentence and kept in the `cache` (the decoder
    state) as `{prefix}cross_k` / `{prefix}cross_v` (B, H, S, Dh).
    """

    def __init__(self, d_model: int, heads: int, *, dropout: float) -> None:
        super().__init__(d_model, heads, dropout=dropout)
        self.query = nn.Linear(d_model, d_model)
        self.key_value = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_bias: Tensor | None,
        cache: DecoderState | None = None,
        prefix: str = "",
        *,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D), memory (B, S, D), memory_bias (B, 1, 1, S) (`key_padding_bias` or a bool mask,
        True on real tokens; None: no padding) -> (B, T, D) and, with `need_weights`, the attention weights (B, H, T, S) (else
        None: the fused fast path)."""
        query = self.split_heads(self.query(x))  # (B, H, T, Dh)
        if cache is not None and prefix + "cross_k" in cache:
            key, value = cache[prefix + "cross_k"], cache[prefix + "cross_v"]
        else:
            key, value = self.key_value(memory).chunk(2, dim=-1)
            key, value = self.split_heads(key), self.split_heads(value)  # (B, H, S, Dh)
            if cache is not None:
                cache[prefix + "cross_k"], cache[prefix + "cross_v"] = key, value
        if key.size(0) != query.size(0):
            return self._attend_by_sentence(query, key, value=value, mask=memory_bias, need_weights=need_weights)
        if need_weights:
            return self.attend_with_weights(query, key, value=value, mask=memory_bias)
        return self.attend(query, key, value=value, mask=memory_bias, causal=False), None

    def _attend_by_sentence(
        self, query: Tensor, key: Tensor, *, value: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Cached keys and values (A, H, S, Dh) of one row a sentence, read by the sentence's K rows of `query`
        (A*K, H, T, Dh) (beam search's beams) as one query of K*T positions: each key is read once a sentence, not
        once a beam. The same output (A*K, T, D) and weights (A*K, H, T, S) as with the keys repeated K times."""
        rows, heads, steps, dim = query.shape
        sentences = key.size(0)
        beams = rows // sentences
        grouped = query.view(sentences, beams, heads, steps, dim).transpose(1, 2).reshape(sentences, heads, -1, dim)
        if not need_weights and query.device.type != "cpu":
            return self.attend(grouped, key, value=value, mask=mask, causal=False).view(rows, steps, -1), None
        # on the CPU, plain products outrun the fused kernel on so few queries
        output, weights = self.attend_with_weights(grouped, key, value=value, mask=mask)
        weights = weights.view(sentences, heads, beams, steps, -1).transpose(1, 2).reshape(rows, heads, steps, -1)
        return output.view(rows, steps, -1), weights


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}  # model.activation


class FeedForward(nn.Module):
    """Position-wise feed-forward network: Linear -> activation (ReLU, GELU or swish) -> dropout -> Linear."""

    def __init__(self, d_model: int, ffn_dim: int, *, dropout: float, activation: str = "relu") -> None:
        super().__init__()
        self.inner = nn.Linear(d_model, ffn_dim)
        self.outer = nn.Linear(ffn_dim, d_model)
        self.dropout = Dropout(dropout)
        self.activation = activation
        self._activate = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.outer(self.dropout(self._activate(self.inner(x))))


class Residual(nn.Module):
    """Residual connection with LayerNorm before (pre-norm) or after (post-norm) the sublayer."""

    def __init__(self, d_model: int, dropout: float, *, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def sublayer_input(self, x: Tensor) -> Tensor:
        """What the sublayer sees: LayerNorm(x) for pre-norm, x itself for post-norm."""
        return self.norm(x) if self.pre_norm else x

    def combine(self, x: Tensor, output: Tensor) -> Tensor:
        """The block's result from its input x and the sublayer's output."""
        if self.pre_norm:
            return x + self.dropout(output)
        return self.norm(x + self.dropout(output))

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        return self.combine(x, sublayer(self.sublayer_input(x)))
