"""The configuration of mtkit's Transformer in Hugging Face `transformers` (`AutoConfig` with `trust_remote_code=True`).

Its keys are the `model` recipe keys that fix the architecture, plus the vocabulary sizes and mtkit's special ids
(pad 0, unk 1, bos 2, eos 3: the decoder starts from BOS).
"""

from __future__ import annotations

from transformers import PretrainedConfig

CHOICES = {
    "norm": ("pre", "post"),
    "positions": ("sinusoidal", "sinusoidal_halves", "learned"),
    "activation": ("relu", "gelu", "swish"),
}


class MtkitConfig(PretrainedConfig):
    """mtkit's Transformer: `encoder_layers` / `decoder_layers` are the depths themselves (a recipe's 0 means
    `layers`); `tie_embeddings`: the output projection is the target embedding; `share_embeddings`: one
    embedding table for both sides (mtkit shares it when the vocabulary is joint and embeddings are tied)."""

    model_type = "mtkit-transformer"
    # The names transformers' generic code asks for; the decoder's depth sizes generate's caches.
    attribute_map = {"hidden_size": "d_model", "num_attention_heads": "heads", "num_hidden_layers": "decoder_layers"}

    def __init__(
        self,
        src_vocab_size: int = 32000,
        tgt_vocab_size: int = 32000,
        *,
        d_model: int = 512,
        heads: int = 8,
        ffn_dim: int = 2048,
        encoder_layers: int = 6,
        decoder_layers: int = 6,
        norm: str = "pre",
        positions: str = "sinusoidal",
        max_positions: int = 1024,
        activation: str = "relu",
        tie_embeddings: bool = True,
        share_embeddings: bool = True,
        output_bias: bool = False,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        pad_token_id: int = 0,
        bos_token_id: int = 2,
        eos_token_id: int = 3,
        decoder_start_token_id: int = 2,
        use_cache: bool = True,
        **kwargs,  # transformers' own keys (architectures, auto_map, dtype, ...)
    ) -> None:
        super().__init__(**kwargs)
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.d_model, self.heads, self.ffn_dim = d_model, heads, ffn_dim
        self.encoder_layers, self.decoder_layers = encoder_layers, decoder_layers
        self.norm, self.positions, self.max_positions, self.activation = norm, positions, max_positions, activation
        self.tie_embeddings, self.share_embeddings, self.output_bias = tie_embeddings, share_embeddings, output_bias
        self.dropout, self.attention_dropout = dropout, attention_dropout
        self.pad_token_id, self.bos_token_id, self.eos_token_id = pad_token_id, bos_token_id, eos_token_id
        self.decoder_start_token_id, self.use_cache = decoder_start_token_id, use_cache
        # Set after the base class, which would otherwise take them from a saved config.json: they follow from the above.
        self.vocab_size = tgt_vocab_size  # what generate and the logits processors index
        self.tie_word_embeddings = tie_embeddings  # transformers ties nothing without it
        self.is_encoder_decoder = True
        self._check()

    def _check(self) -> None:
        for key, allowed in CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key}={getattr(self, key)!r} is not one of {', '.join(allowed)}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by heads={self.heads}")
        if self.share_embeddings and not (self.tie_embeddings and self.src_vocab_size == self.tgt_vocab_size):
            raise ValueError("share_embeddings needs tie_embeddings and equal src_vocab_size and tgt_vocab_size")
