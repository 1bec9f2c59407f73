"""Model package: `build_model` turns the `model` section of a recipe into an `EncoderDecoder`."""

from __future__ import annotations

from mtkit.config import ModelConfig, arch_keys
from mtkit.data.tokenizer import PAD_ID
from mtkit.errors import MtkitError
from mtkit.models.base import EncoderDecoder
from mtkit.models.rnn import RNNSeq2Seq
from mtkit.models.transformer import Transformer


def build_model(config: ModelConfig, src_vocab_size: int, *, tgt_vocab_size: int, share_vocab: bool) -> EncoderDecoder:
    """A plain if/elif over `model.arch`; the recipe keys of that architecture are its constructor's arguments.

    The config was checked when it was loaded (ranges, heads dividing d_model, ...), so a bad
    recipe fails there, before any data is read.
    """
    arguments = {key: getattr(config, key) for key in arch_keys(config.arch)}
    if config.arch == "transformer":
        return Transformer(src_vocab_size, tgt_vocab_size, share_vocab=share_vocab, pad_id=PAD_ID, **arguments)
    if config.arch == "rnn":
        return RNNSeq2Seq(src_vocab_size, tgt_vocab_size, share_vocab=share_vocab, pad_id=PAD_ID, **arguments)
    raise MtkitError(f"model.arch={config.arch!r} is not known; choose transformer or rnn")
