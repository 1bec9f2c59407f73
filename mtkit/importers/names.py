"""The name tables between mtkit and Hugging Face `transformers`, read by the importers and by
mtkit.exporters.transformers, so the two directions cannot drift."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from mtkit.config import ModelConfig

SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # Hugging Face name -> model.activation
# generate()'s settings of a Marian folder that its transformers export writes back (`mtkit export --format
# transformers`), by kind: what transformers' own generate does at the length cap, the words it never writes, its cap,
# and its scores. Its beam is the run's decode.beam; mtkit's own search reads none of these.
KEPT_GENERATION = {"forced_eos_token_id": "ids", "bad_words_ids": "words", "max_length": "length", "renormalize_logits": "flag"}


@dataclass(frozen=True, kw_only=True)
class TokenizerFamily:
    """One transformers tokenizer class an imported family's folder holds, and that its export writes back: the run
    records its `name` (`tokenizer.family`), so the export never guesses the family from the pieces."""

    name: str  # the run's tokenizer.family; the export's form (mtkit_export.json, the model card's tag)
    class_name: str  # transformers' tokenizer class (tokenizer_config.json's tokenizer_class)
    code: str  # how the class writes a language code, `{}` the name: __{}__ (M2M-100: __de__), {} (deu_Latn, de_DE)
    vocab_json: bool = False  # a vocab.json of the pieces, the codes named by tokenizer_config.json's language_codes
    added_tokens: bool = False  # tokenizer_config.json lists the codes and <mask> at the table's ids (added_tokens_decoder)
    drops_specials: bool = False  # numbers every SentencePiece piece but fairseq's four; else those after the first three
    english: str = ""  # its name of English: the source of an import whose tokenizer_config.json names none
    settings: Mapping[str, Any] = field(default_factory=dict)  # fixed keys of its tokenizer_config.json

    def writes(self, piece: str) -> bool:
        """Whether `piece` is a language code as this class writes one (__de__ for __{}__)."""
        before, after = self.code.split("{}")
        return len(piece) > len(before) + len(after) and piece.startswith(before) and piece.endswith(after)

    def piece(self, name: str) -> str:
        """The piece of language `name` (de -> __de__ for M2M100Tokenizer)."""
        return self.code.format(name)


# The one table of names between mtkit's Transformer layers and Marian's (transformers' MarianMTModel),
# read by the Marian importer and by mtkit.exporters.transformers: mtkit's parameter <- Marian's, joined
# along the first dimension in this order (mtkit fuses q, k, v and the cross-attention's k, v).
ENCODER_LAYER_NAMES = {
    "self_attention.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attention.out": ("self_attn.out_proj",),
    "attention_block.norm": ("self_attn_layer_norm",),
    "feed_forward.inner": ("fc1",),
    "feed_forward.outer": ("fc2",),
    "ffn_block.norm": ("final_layer_norm",),
}
DECODER_LAYER_NAMES = {
    "self_attention.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attention.out": ("self_attn.out_proj",),
    "self_block.norm": ("self_attn_layer_norm",),
    "cross_attention.query": ("encoder_attn.q_proj",),
    "cross_attention.key_value": ("encoder_attn.k_proj", "encoder_attn.v_proj"),
    "cross_attention.out": ("encoder_attn.out_proj",),
    "cross_block.norm": ("encoder_attn_layer_norm",),
    "feed_forward.inner": ("fc1",),
    "feed_forward.outer": ("fc2",),
    "ffn_block.norm": ("final_layer_norm",),
}


def depths(model: ModelConfig) -> tuple[int, int]:
    """The encoder's and the decoder's layers: a recipe's `encoder_layers` / `decoder_layers` 0 means `layers`."""
    return model.encoder_layers or model.layers, model.decoder_layers or model.layers


def layer_names(model: ModelConfig) -> list[tuple[str, tuple[str, ...]]]:
    """Every layer parameter: (mtkit's name, the Marian names it joins), e.g.
    ("encoder_layers.0.self_attention.qkv.weight", ("encoder.layers.0.self_attn.q_proj.weight", ...))."""
    found = []
    encoder, decoder = depths(model)
    for stack, count, table in (("encoder", encoder, ENCODER_LAYER_NAMES), ("decoder", decoder, DECODER_LAYER_NAMES)):
        for index, (mine, theirs), part in itertools.product(range(count), table.items(), ("weight", "bias")):
            found.append((f"{stack}_layers.{index}.{mine}.{part}", tuple(f"{stack}.layers.{index}.{t}.{part}" for t in theirs)))
    return found
