"""Model package: `build_model` turns the `model` section of a recipe into an `EncoderDecoder`."""

from __future__ import annotations

from mtkit.config import ModelConfig
from mtkit.errors import MtkitError
from mtkit.models.base import EncoderDecoder
from mtkit.models.rnn import RNNSeq2Seq
from mtkit.models.transformer import Transformer
from mtkit.tokenizer import PAD_ID


def build_model(config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, share_vocab: bool) -> EncoderDecoder:
    """A plain if/elif over `model.arch`; each architecture takes plain constructor arguments."""
    if config.arch == "transformer":
        return Transformer(
            src_vocab_size,
            tgt_vocab_size,
            layers=config.layers,
            d_model=config.d_model,
            heads=config.heads,
            ffn_dim=config.ffn_dim,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            norm=config.norm,
            positions=config.positions,
            tie_embeddings=config.tie_embeddings,
            share_vocab=share_vocab,
            max_positions=config.max_positions,
            pad_id=PAD_ID,
        )
    if config.arch == "rnn":
        return RNNSeq2Seq(
            src_vocab_size,
            tgt_vocab_size,
            cell=config.cell,
            layers=config.layers,
            hidden_size=config.hidden_size,
            embed_dim=config.embed_dim,
            bidirectional=config.bidirectional,
            attention=config.attention,
            input_feed=config.input_feed,
            dropout=config.dropout,
            tie_embeddings=config.tie_embeddings,
            share_vocab=share_vocab,
            pad_id=PAD_ID,
        )
    raise MtkitError(f"model.arch={config.arch!r} is not known; choose transformer or rnn")


__all__ = ["EncoderDecoder", "RNNSeq2Seq", "Transformer", "build_model"]
