"""mtkit's Transformer in Hugging Face `transformers`: `AutoModelForSeq2SeqLM` loads it with `trust_remote_code=True`.

The same layers as `mtkit.models.transformer`, written with torch and transformers alone (an exported folder
carries this file), under mtkit's parameter names, so an mtkit state dict loads unchanged and gives the same
numbers: pre- or post-norm blocks, interleaved or half-split sinusoidal or learned positions, a ReLU, GELU or
swish feed-forward, tied output and shared embeddings, an optional output bias. `generate` decodes incrementally
with transformers' `EncoderDecoderCache`: each step appends its self-attention keys/values, and the memory's are
projected once. Tested with transformers 5.24 (whose generate passes the cache as `cache`) and 4.57 (as
`past_key_values`, with a `cache_position` this model has no use for: positions follow the cache's length).
Each layer copied from mtkit is marked `# Copied from mtkit.<module>.<name>`; mtkit's tests hold it equal to that one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from .configuration_mtkit import MtkitConfig

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}
IGNORED_LABEL = -100  # transformers' convention for label positions left out of the loss
# The output field that hands the cache back to generate: `cache` from transformers 5, `past_key_values` before.
CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


# Copied from mtkit.models.layers.ScaledEmbedding
class MtkitEmbedding(nn.Module):
    """Token embeddings multiplied by sqrt(d_model)."""

    def __init__(self, vocab_size: int, d_model: int, *, pad_id: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.scale = math.sqrt(d_model)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.embedding(tokens) * self.scale  # (B, T, D)


# Copied from mtkit.models.layers.SinusoidalPositions
class MtkitSinusoidalPositions(nn.Module):
    """Fixed sine/cosine encodings: interleaved columns computed in float32, or (`halves`) every frequency's sine,
    then the cosines, computed in float64 and rounded once.

    The table is a plain attribute built on first use, not a buffer: transformers builds a model on the meta
    device and leaves buffers that are not saved uninitialised. It holds `max_positions` rows and grows as mtkit's.
    """

    def __init__(self, d_model: int, max_positions: int, *, halves: bool) -> None:
        super().__init__()
        self.d_model, self.max_positions, self.halves = d_model, max_positions, halves
        self.table: Tensor | None = None

    def _table(self, length: int) -> Tensor:
        if self.halves:
            position = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (L, 1)
            angle = position / torch.pow(10000.0, torch.arange(0, self.d_model, 2, dtype=torch.float64) / self.d_model)
            half = self.d_model // 2 + self.d_model % 2
            return torch.cat([torch.sin(angle), torch.cos(angle[:, : self.d_model - half])], dim=1).to(torch.float32)
        position = torch.arange(length, dtype=torch.float32).unsqueeze(1)  # (L, 1)
        frequency = torch.exp(torch.arange(0, self.d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / self.d_model))
        table = torch.zeros(length, self.d_model)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency[: self.d_model // 2])
        return table  # (L, D)

    def forward(self, length: int, offset: int, like: Tensor) -> Tensor:
        """Rows offset .. offset + length (T, D), in `like`'s device and dtype."""
        end = offset + length
        if self.table is None or end > self.table.size(0):
            self.table = self._table(self.max_positions if self.table is None and end <= self.max_positions else 2 * end)
        if self.table.device != like.device:
            self.table = self.table.to(like.device)  # once, not every step
        return self.table[offset:end].to(like.dtype)


# Copied from mtkit.models.layers.LearnedPositions
class MtkitLearnedPositions(nn.Module):
    """Trained position embeddings for at most `max_positions` positions."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)

    def forward(self, length: int, offset: int, like: Tensor) -> Tensor:
        if offset + length > self.embedding.num_embeddings:
            raise ValueError(
                f"sequence of {offset + length} tokens is longer than the model's learned positions "
                f"({self.embedding.num_embeddings}); shorten the input or lower max_new_tokens"
            )
        return self.embedding(torch.arange(offset, offset + length, device=like.device))  # (T, D)


# Copied from mtkit.models.layers.MultiHeadAttention
class MtkitAttention(nn.Module):
    """What self- and cross-attention share: heads, fused scaled dot-product attention, the output projection."""

    def __init__(self, d_model: int, heads: int, *, dropout: float, layer_idx: int | None) -> None:
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, d_model // heads, dropout
        self.layer_idx = layer_idx  # the decoder layer's slot in generate's caches

    def split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def attend(self, query: Tensor, key: Tensor, *, value: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """Attention of the heads, merged and projected (B, T, D); mask: bool, True = may attend."""
        dropout = self.dropout if self.training else 0.0
        context = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=causal)
        batch, _, length, _ = context.shape
        return self.out(context.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))  # (B, T, D)


# Copied from mtkit.models.layers.SelfAttention
class MtkitSelfAttention(MtkitAttention):
    """Self-attention with one fused query/key/value projection; causal in the decoder, where a `cache` (a
    `DynamicCache`) makes it incremental: `x` holds only the new positions, whose keys/values it appends."""

    def __init__(self, d_model: int, heads: int, *, dropout: float, causal: bool, layer_idx: int | None = None) -> None:
        super().__init__(d_model, heads, dropout=dropout, layer_idx=layer_idx)
        self.causal = causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, key_mask: Tensor | None = None, cache: DynamicCache | None = None) -> Tensor:
        """x (B, T, D) -> (B, T, D); key_mask (B, 1, 1, T) bool, True on real tokens (the encoder's)."""
        query, key, value = (self.split_heads(part) for part in self.qkv(x).chunk(3, dim=-1))  # (B, H, T, Dh)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)  # (B, H, t + T, Dh)
        if not self.causal:
            return self.attend(query, key, value=value, mask=key_mask, causal=False)
        new, past = query.size(2), key.size(2) - query.size(2)
        # New query i (absolute position past + i) sees keys up to its own position; one new query sees them all.
        mask = torch.ones(new, past + new, dtype=torch.bool, device=x.device).tril(past) if past and new > 1 else None
        return self.attend(query, key, value=value, mask=mask, causal=not past)


# Copied from mtkit.models.layers.CrossAttention
class MtkitCrossAttention(MtkitAttention):
    """Decoder-to-encoder attention; with a cache the memory's keys/values are projected once per sentence."""

    def __init__(self, d_model: int, heads: int, *, dropout: float, layer_idx: int | None = None) -> None:
        super().__init__(d_model, heads, dropout=dropout, layer_idx=layer_idx)
        self.query = nn.Linear(d_model, d_model)
        self.key_value = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None, cache: EncoderDecoderCache | None) -> Tensor:
        """x (B, T, D), memory (B, S, D), memory_mask (B, 1, 1, S) -> (B, T, D)."""
        query = self.split_heads(self.query(x))  # (B, H, T, Dh)
        if cache is not None and cache.is_updated.get(self.layer_idx):
            stored = cache.cross_attention_cache.layers[self.layer_idx]
            key, value = stored.keys, stored.values
        else:
            key, value = (self.split_heads(part) for part in self.key_value(memory).chunk(2, dim=-1))  # (B, H, S, Dh)
            if cache is not None:
                key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
                cache.is_updated[self.layer_idx] = True
        return self.attend(query, key, value=value, mask=memory_mask, causal=False)


# Copied from mtkit.models.layers.FeedForward
class MtkitFeedForward(nn.Module):
    """Position-wise feed-forward network: Linear -> activation -> dropout -> Linear."""

    def __init__(self, d_model: int, ffn_dim: int, *, dropout: float, activation: str) -> None:
        super().__init__()
        self.inner = nn.Linear(d_model, ffn_dim)
        self.outer = nn.Linear(ffn_dim, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activate = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.outer(self.dropout(self.activate(self.inner(x))))


# Copied from mtkit.models.layers.Residual
class MtkitResidual(nn.Module):
    """Residual connection with LayerNorm before (pre-norm) or after (post-norm) the sublayer."""

    def __init__(self, d_model: int, dropout: float, *, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


# Copied from mtkit.models.transformer.EncoderLayer
class MtkitEncoderLayer(nn.Module):
    def __init__(self, config: MtkitConfig) -> None:
        super().__init__()
        d_model, pre_norm = config.d_model, config.norm == "pre"
        self.self_attention = MtkitSelfAttention(d_model, config.heads, dropout=config.attention_dropout, causal=False)
        self.feed_forward = MtkitFeedForward(d_model, config.ffn_dim, dropout=config.dropout, activation=config.activation)
        self.attention_block, self.ffn_block = (MtkitResidual(d_model, config.dropout, pre_norm=pre_norm) for _ in range(2))

    def forward(self, x: Tensor, key_mask: Tensor | None) -> Tensor:
        """x (B, S, D); key_mask (B, 1, 1, S) bool, True on real tokens."""
        x = self.attention_block(x, lambda h: self.self_attention(h, key_mask))
        return self.ffn_block(x, self.feed_forward)


# Copied from mtkit.models.transformer.DecoderLayer
class MtkitDecoderLayer(nn.Module):
    def __init__(self, config: MtkitConfig, layer_idx: int) -> None:
        super().__init__()
        d_model, heads, pre_norm = config.d_model, config.heads, config.norm == "pre"
        self.self_attention = MtkitSelfAttention(
            d_model, heads, dropout=config.attention_dropout, causal=True, layer_idx=layer_idx
        )
        self.cross_attention = MtkitCrossAttention(d_model, heads, dropout=config.attention_dropout, layer_idx=layer_idx)
        self.feed_forward = MtkitFeedForward(d_model, config.ffn_dim, dropout=config.dropout, activation=config.activation)
        blocks = (MtkitResidual(d_model, config.dropout, pre_norm=pre_norm) for _ in range(3))
        self.self_block, self.cross_block, self.ffn_block = blocks

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None, cache: EncoderDecoderCache | None) -> Tensor:
        """x (B, T, D) new target positions; memory (B, S, D); memory_mask (B, 1, 1, S) -> (B, T, D)."""
        self_cache = cache.self_attention_cache if cache is not None else None
        x = self.self_block(x, lambda h: self.self_attention(h, cache=self_cache))
        x = self.cross_block(x, lambda h: self.cross_attention(h, memory, memory_mask, cache))
        return self.ffn_block(x, self.feed_forward)


# Copied from mtkit.models.layers.make_positions
def make_positions(config: MtkitConfig) -> nn.Module:
    if config.positions == "learned":
        return MtkitLearnedPositions(config.d_model, config.max_positions)
    return MtkitSinusoidalPositions(config.d_model, config.max_positions, halves=config.positions == "sinusoidal_halves")


class MtkitEncoder:
    """What `get_encoder()` gives generate: the encoder half as a callable that holds no weights of its own, so
    the model's parameter names stay mtkit's."""

    main_input_name = "input_ids"

    def __init__(self, model: MtkitForConditionalGeneration) -> None:
        self.model = model

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = True,  # generate asks for it; the answer is always a BaseModelOutput
    ) -> BaseModelOutput:
        if output_attentions or output_hidden_states:
            raise ValueError(
                "this model returns no attention weights or hidden states; leave output_attentions/hidden_states off"
            )
        return BaseModelOutput(last_hidden_state=self.model.encode(input_ids, attention_mask))

    __call__ = forward


class MtkitPreTrainedModel(PreTrainedModel):
    config_class = MtkitConfig
    base_model_prefix = "mtkit"  # no submodule of that name: the parameters sit at the top, under mtkit's names
    main_input_name = "input_ids"
    _no_split_modules = ["MtkitEncoderLayer", "MtkitDecoderLayer"]

    def _init_weights(self, module: nn.Module) -> None:
        """mtkit's initialisation: embeddings and an untied output layer N(0, d_model^-0.5) (a zero padding row, a
        zero output bias), torch's defaults elsewhere. Tied copies are tied after this, to the embedding."""
        std = self.config.d_model**-0.5
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif module is getattr(self, "output", None):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.Linear, nn.LayerNorm)):
            module.reset_parameters()


class MtkitForConditionalGeneration(MtkitPreTrainedModel, GenerationMixin):
    """The encoder-decoder with its output layer; `forward` gives logits (B, T, V), `generate` translates."""

    def __init__(self, config: MtkitConfig) -> None:
        super().__init__(config)
        d_model, pad_id = config.d_model, config.pad_token_id
        self.src_embed = MtkitEmbedding(config.src_vocab_size, d_model, pad_id=pad_id)
        self.tgt_embed = (
            self.src_embed if config.share_embeddings else MtkitEmbedding(config.tgt_vocab_size, d_model, pad_id=pad_id)
        )
        self.src_positions, self.tgt_positions = make_positions(config), make_positions(config)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(MtkitEncoderLayer(config) for _ in range(config.encoder_layers))
        self.decoder_layers = nn.ModuleList(MtkitDecoderLayer(config, index) for index in range(config.decoder_layers))
        # Pre-norm stacks end with a LayerNorm; post-norm blocks already normalise their output.
        self.encoder_norm = nn.LayerNorm(d_model) if config.norm == "pre" else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if config.norm == "pre" else nn.Identity()
        self.output = nn.Linear(d_model, config.tgt_vocab_size, bias=config.output_bias)
        # {tied copy: the parameter it is}: transformers 5 ties them (with config.tie_word_embeddings) and saves one.
        embedding = "src_embed.embedding.weight" if config.share_embeddings else "tgt_embed.embedding.weight"
        self._tied_weights_keys = {"output.weight": embedding}
        if config.share_embeddings:
            self._tied_weights_keys["tgt_embed.embedding.weight"] = embedding
        self.post_init()

    def get_encoder(self) -> MtkitEncoder:
        return MtkitEncoder(self)

    def get_input_embeddings(self) -> nn.Embedding:
        """The target embedding: the one the output layer is tied to (transformers 4 ties through this method)."""
        return self.tgt_embed.embedding

    def get_output_embeddings(self) -> nn.Linear:
        return self.output

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """input_ids (B, S) -> memory (B, S, D); without `attention_mask`, padding is where input_ids is pad."""
        x = self.src_embed(input_ids)
        x = self.dropout(x + self.src_positions(input_ids.size(1), 0, x))
        key_mask = self.source_mask(input_ids, attention_mask)
        for layer in self.encoder_layers:
            x = layer(x, key_mask)
        return self.encoder_norm(x)

    def source_mask(self, input_ids: Tensor | None, attention_mask: Tensor | None) -> Tensor | None:
        """(B, 1, 1, S) bool, True on real source tokens; None: attend everywhere."""
        if attention_mask is None:
            attention_mask = input_ids.ne(self.config.pad_token_id) if input_ids is not None else None
        return attention_mask.bool()[:, None, None, :] if attention_mask is not None else None

    def decode(
        self, decoder_input_ids: Tensor, memory: Tensor, *, memory_mask: Tensor | None, cache: EncoderDecoderCache | None
    ) -> Tensor:
        """decoder_input_ids (B, T), the new tokens when `cache` holds earlier ones -> logits (B, T, V)."""
        offset = cache.get_seq_length() if cache is not None else 0  # positions go on after the cached tokens
        x = self.tgt_embed(decoder_input_ids)
        x = self.dropout(x + self.tgt_positions(decoder_input_ids.size(1), offset, x))
        for layer in self.decoder_layers:
            x = layer(x, memory, memory_mask, cache)
        return self.output(self.decoder_norm(x))

    def prepare_inputs_for_generation(self, *args, **kwargs) -> dict:  # generate's own arguments, passed on
        """generate's inputs for the next step, less the `cache_position` that transformers 4 adds."""
        inputs = super().prepare_inputs_for_generation(*args, **kwargs)
        inputs.pop("cache_position", None)
        return inputs

    def prepare_decoder_input_ids_from_labels(self, labels: Tensor) -> Tensor:
        """Teacher forcing: the decoder start, then the labels but the last; ignored labels read as padding."""
        start = labels.new_full((labels.size(0), 1), self.config.decoder_start_token_id)
        shifted = torch.cat([start, labels[:, :-1]], dim=1)
        return shifted.masked_fill(shifted.eq(IGNORED_LABEL), self.config.pad_token_id)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple[Tensor, ...] | None = None,
        cache: EncoderDecoderCache | None = None,
        labels: Tensor | None = None,
        *,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: EncoderDecoderCache | None = None,
    ) -> Seq2SeqLMOutput | tuple:
        """Logits (B, T, V) of `decoder_input_ids` (from `labels` when not given) for the source `input_ids`
        (or its `encoder_outputs`). `cache` (`past_key_values`, its name before transformers 5) holds the
        earlier steps; with `use_cache` (the config's default, off with labels) a new one is started."""
        if encoder_outputs is None:
            encoder_outputs = self.get_encoder()(input_ids, attention_mask)
        memory = encoder_outputs[0]
        if decoder_input_ids is None and labels is not None:
            decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        cache = cache if cache is not None else past_key_values
        use_cache = labels is None and (self.config.use_cache if use_cache is None else use_cache)
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        logits = self.decode(decoder_input_ids, memory, memory_mask=self.source_mask(input_ids, attention_mask), cache=cache)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORED_LABEL)
        output = Seq2SeqLMOutput(loss=loss, logits=logits, encoder_last_hidden_state=memory, **{CACHE_FIELD: cache})
        return output.to_tuple() if return_dict is False else output
