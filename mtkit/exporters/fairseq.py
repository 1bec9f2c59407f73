"""`mtkit export --format transformers` of an imported (or fine-tuned) NLLB-200, M2M-100 or mBART-50 model: the folder
of its own transformers class and tokenizer class (no remote code), both read from the family's rows
(mtkit.importers.m2m100, mtkit.importers.mbart) that the run records.

The import's steps inverted (mtkit.importers.fairseq): mtkit's rows go back to fairseq's id layout (<s> 0, <pad> 1,
</s> 2, <unk> 3, the SentencePiece pieces shifted by one, the language codes, <mask>); mtkit's BOS, which holds the
row of </s> (the decoder start), is dropped, and the decoder starts from </s> again. The tokenizer files are the
SentencePiece model and a tokenizer_config.json naming the class (M2M-100: vocab.json too), from which each class
builds the table this folder's ids follow; the table is checked against it before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch

from mtkit.config import Config, ModelConfig
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from mtkit.errors import MtkitError
from mtkit.exporters.folder import MAX_LENGTH, write_json, write_safetensors
from mtkit.importers import RunFamily
from mtkit.importers.fairseq import FILLER, M2M100_CODES, SENTENCEPIECE, SPECIALS
from mtkit.importers.loader import Family
from mtkit.importers.names import ACTIVATIONS, TokenizerFamily, depths, layer_names
from mtkit.models.transformer import Transformer
from mtkit.textio import write_file

FAIRSEQ_START = 4  # mtkit's id of fairseq's <s>, an ordinary piece after mtkit's four specials
# mtkit id of each of fairseq's ids 0..3 (<s>, <pad>, </s>, <unk>); fairseq's id k >= 4 is mtkit's k + 1
FAIRSEQ_SPECIALS = (FAIRSEQ_START, PAD_ID, EOS_ID, UNK_ID)
ROW_TOLERANCE = 1e-6  # how far BOS's row may be from EOS's: both are the one row of </s> in transformers


def fairseq_order(vocab_size: int) -> list[int]:
    """order[fairseq_id] = mtkit_id: the import's reordering inverted, BOS (a copy of </s>) left out."""
    return [*FAIRSEQ_SPECIALS, *range(FAIRSEQ_START + 1, vocab_size)]


def fairseq_pieces(tokenizer: Tokenizer) -> list[str]:
    """The table in fairseq's id order, checked to be an imported fairseq-born table (<s> at mtkit's ids 2 and 4)."""
    table = tokenizer.table or []
    if len(table) <= FAIRSEQ_START or table[BOS_ID] != "<s>" or table[FAIRSEQ_START] != "<s>":
        raise MtkitError("the model's piece table is not an imported NLLB-200, M2M-100 or mBART-50 one; re-import the model")
    return [table[index] for index in fairseq_order(len(table))]


def tokenizer_files(held: TokenizerFamily, config: Config, *, tokenizer: Tokenizer, pieces: list[str]) -> dict[str, Any]:
    """The tokenizer class's JSON files by name (tokenizer_config.json; M2M-100's: vocab.json), after checking that
    the class builds `pieces`' ids from them and the SentencePiece model."""
    code_pieces = {(tokenizer.table or [])[index] for index in tokenizer.codes.values()}
    codes = [piece for piece in pieces if piece in code_pieces]
    settings: dict[str, Any] = {"tokenizer_class": held.class_name, "src_lang": config.src_lang, **held.settings}
    if config.tgt_lang in tokenizer.codes:
        settings["tgt_lang"] = config.tgt_lang
    files: dict[str, Any] = {"tokenizer_config.json": settings}
    if held.vocab_json:  # vocab.json's pieces in their own order, the codes of a known list, the made-up words
        vocab = pieces[: pieces.index(codes[0])]
        listed = [name for name, known in M2M100_CODES.items() if [held.piece(code) for code in known] == codes]
        fillers = len(pieces) - len(vocab) - len(codes)
        expected = [*vocab, *codes, *(FILLER.format(k) for k in range(fillers))] if listed else []
        settings |= {"language_codes": listed[0] if listed else "", "num_madeup_words": fillers}
        settings["extra_special_tokens"] = codes  # special, so skip_special_tokens drops the forced code
        files["vocab.json"] = {piece: index for index, piece in enumerate(vocab)}
    else:  # the SentencePiece pieces shifted by one, the codes, <mask>
        shifted = sentencepiece_pieces(held, tokenizer)
        expected = [*SPECIALS, *shifted, *codes, "<mask>"]
        if held.added_tokens:  # the codes and <mask> at the table's ids, in whatever order the table holds them
            added = pieces[len(SPECIALS) + len(shifted) :]
            expected = [*SPECIALS, *shifted, *added] if sorted(added) == sorted([*codes, "<mask>"]) else []
            settings["extra_special_tokens"] = codes
            settings["added_tokens_decoder"] = {str(pieces.index(piece)): added_token(piece) for piece in added}
    if expected != pieces:
        raise MtkitError(_table_differs(held.class_name, pieces, expected))
    return files


def _table_differs(tokenizer_class: str, pieces: list[str], expected: list[str]) -> str:
    """The refusal when the model's table is not the tokenizer class's: where the two first differ."""
    first = next((index for index, pair in enumerate(zip(pieces, expected, strict=False)) if pair[0] != pair[1]), None)
    where = f"id {first} is {pieces[first]!r} where it builds {expected[first]!r}" if first is not None else "sizes differ"
    return (
        f"the model's table ({len(pieces)} pieces) is not what {tokenizer_class} builds from its SentencePiece model and "
        f"language codes ({len(expected)} pieces; {where}), as when pieces or codes were added after the import; export it "
        "with --format ctranslate2 or translate it with mtkit"
    )


def sentencepiece_pieces(held: TokenizerFamily, tokenizer: Tokenizer) -> list[str]:
    """The SentencePiece model's pieces as the tokenizer class numbers them after fairseq's four specials: NLLB's
    takes every piece that is not one of the four (`drops_specials`: a model holding <s>, <pad>, </s> and <unk> as
    its first pieces gives them once); mBART-50's every piece after the model's first three (<unk>, <s>, </s>)."""
    processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    pieces = [processor.id_to_piece(index) for index in range(processor.get_piece_size())]
    return [piece for piece in pieces if piece not in SPECIALS] if held.drops_specials else pieces[3:]


def added_token(piece: str) -> dict[str, Any]:
    """A special token of tokenizer_config.json's `added_tokens_decoder`, as NLLB's tokenizer writes its codes and <mask>."""
    mask = piece == "<mask>"
    return {"content": piece, "lstrip": mask, "normalized": False, "rstrip": False, "single_word": False, "special": True}


def fairseq_config(held: RunFamily, m: ModelConfig, *, vocab_size: int) -> dict[str, Any]:
    """config.json of the family's class: the import's `fairseq_model_config` and `transformer_sizes` inverted."""
    encoder_layers, decoder_layers = depths(m)
    activation = next(theirs for theirs, mine in ACTIVATIONS.items() if mine == m.activation)
    return {
        "architectures": [held.family.architecture],
        "model_type": held.family.model_type,
        "vocab_size": vocab_size,
        "d_model": m.d_model,
        "encoder_layers": encoder_layers,
        "decoder_layers": decoder_layers,
        "encoder_attention_heads": m.heads,
        "decoder_attention_heads": m.heads,
        "encoder_ffn_dim": m.ffn_dim,
        "decoder_ffn_dim": m.ffn_dim,
        "activation_function": activation,
        "dropout": m.dropout,
        "attention_dropout": m.attention_dropout,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "max_position_embeddings": m.max_positions,
        "scale_embedding": m.scale_embedding,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "tokenizer_class": held.tokenizer.class_name,
        **fairseq_ids(),
        **held.family.export_keys,
    }


def fairseq_ids() -> dict[str, int]:
    """fairseq's special ids: the decoder starts from </s> and stops at it."""
    return {"bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}


def fairseq_weights(family: Family, model: Transformer, *, m: ModelConfig) -> dict[str, torch.Tensor]:
    """The family's tensors from mtkit's, rows in fairseq's order; what the class cannot hold is refused in one line."""
    weights = {name: tensor.detach().float().contiguous() for name, tensor in model.state_dict().items()}
    embedding, bias = weights["src_embed.embedding.weight"], weights["output.bias"]
    if (embedding[BOS_ID] - embedding[EOS_ID]).abs().max() > ROW_TOLERANCE:
        raise MtkitError(
            "the model's BOS and EOS rows differ, and transformers' class starts the decoder from </s>'s own row; "
            "export it with --format ctranslate2 or translate it with mtkit"
        )
    order = torch.tensor(fairseq_order(embedding.size(0)))
    out = {"model.shared.weight": embedding.index_select(0, order)}
    if family.logits_bias:
        out["final_logits_bias"] = bias.index_select(0, order).reshape(1, -1)
    elif bias.index_select(0, order).abs().max() > ROW_TOLERANCE:
        raise MtkitError(
            f"the model's output bias is not zero and {family.architecture} has none; export it with "
            "--format ctranslate2 or translate it with mtkit"
        )
    for stack, side in (("encoder", "src"), ("decoder", "tgt")):
        for part in ("weight", "bias"):
            out[f"model.{stack}.layer_norm.{part}"] = weights[f"{stack}_norm.{part}"]
            if m.embedding_norm:
                out[f"model.{stack}.layernorm_embedding.{part}"] = weights[f"{side}_embed_norm.{part}"]
        if m.positions == "learned":  # transformers' learned table has two unused rows before position 0
            table = weights[f"{side}_positions.embedding.weight"]
            out[f"model.{stack}.embed_positions.weight"] = torch.cat([table.new_zeros(2, table.size(1)), table])
    for mine, theirs in layer_names(m):
        for name, part in zip(theirs, weights[mine].chunk(len(theirs)), strict=True):
            out[f"model.{name}"] = part.contiguous()
    return out


def generation_config(config: Config) -> dict[str, Any]:
    """generate()'s defaults: the recipe's beam and length penalty; the target code is the user's forced_bos_token_id."""
    return {
        **fairseq_ids(),
        "num_beams": config.decode.beam,
        "length_penalty": config.decode.length_penalty,
        "early_stopping": True,
        "max_length": min(MAX_LENGTH, config.model.max_positions),
    }


def write_fairseq_folder(folder: Path, config: Config, *, model: Transformer, tokenizer: Tokenizer, held: RunFamily) -> None:
    """Write the model, its tokenizer files and generation config into `folder`, in the classes of the run's family."""
    pieces = fairseq_pieces(tokenizer)
    files = tokenizer_files(held.tokenizer, config, tokenizer=tokenizer, pieces=pieces)
    tensors = fairseq_weights(held.family, model, m=config.model)
    write_json(folder / "config.json", fairseq_config(held, config.model, vocab_size=len(pieces)))
    write_safetensors(tensors, folder / "model.safetensors")
    write_json(folder / "generation_config.json", generation_config(config))
    write_file(folder / SENTENCEPIECE, tokenizer.model_proto)
    for name, data in files.items():
        write_json(folder / name, data)
