"""`mtkit export --format transformers`: a folder that Hugging Face `transformers` loads and translates with.

Three forms, chosen by the family the run records (`tokenizer.family`, written by `mtkit import`; mtkit's own
models record none) and the architecture:
- **fairseq-born**: an imported (or fine-tuned) NLLB-200, M2M-100 or mBART-50 model goes back to its own class and
  tokenizer (mtkit.exporters.fairseq), named by its family's rows; no remote code.
- **Marian**: a post-norm Transformer with Marian's sinusoid layout (every imported OPUS-MT model and
  its fine-tuned children) becomes a plain `MarianMTModel` folder; no remote code. Its layer names
  come from the importers' table (`mtkit.importers.names.layer_names`), so the two directions
  cannot drift.
- **remote code**: any other mtkit Transformer (pre-norm, interleaved sinusoids, learned positions)
  keeps mtkit's own parameter names; `config.json` maps `AutoModelForSeq2SeqLM` to the modeling file
  shipped in the folder (`mtkit/exporters/remote_code/`), loaded with `trust_remote_code=True`.

The last two carry `MarianTokenizer` files (source.spm, target.spm, vocab.json in mtkit's id order) and a
generation config with the recipe's beam and length penalty, and a model card (README.md).
A target-language tag `<2fr>` is written `>>fr<<` in vocab.json, which MarianTokenizer reads as the
first token of a text, as mtkit puts the tag first. The decoder's start piece (mtkit's BOS) is `<s>`, declared
the tokenizer's `bos_token`: generate() puts it first in every output, and only a special token is dropped by
`batch_decode(..., skip_special_tokens=True)` (a SentencePiece model without a `<s>` piece would spell it out).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from mtkit.config import Config, ModelConfig
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, TAG, Tokenizer, TokenizerPair
from mtkit.errors import MtkitError, OptionError
from mtkit.exporters.fairseq import write_fairseq_folder
from mtkit.exporters.folder import (
    MAX_LENGTH,
    TRANSFORMERS_NOTE,
    check_exportable,
    check_output_dir,
    staged,
    write_json,
    write_safetensors,
)
from mtkit.exporters.model_card import model_card
from mtkit.importers import RunFamily, run_family
from mtkit.importers.m2m100 import M2M100
from mtkit.importers.marian import MARIAN, MARIAN_TOKENIZER
from mtkit.importers.mbart import MBART
from mtkit.importers.names import ACTIVATIONS, KEPT_GENERATION, depths, layer_names
from mtkit.models.checkpoint import load_model, resolve_checkpoint
from mtkit.models.transformer import Transformer
from mtkit.textio import write_file

FORMAT = "mtkit-transformers-1"
REMOTE_CODE = Path(__file__).resolve().parent / "remote_code"
MARIAN_ACTIVATIONS = {mine: theirs for theirs, mine in ACTIVATIONS.items() if theirs != "silu"}  # swish -> swish
SINUSOID_ROWS = 1024  # the least a Marian-form export's position table holds
START_PIECE = "<s>"  # vocab.json's name of the decoder's start (mtkit's BOS), whatever the SentencePiece model holds
REMOTE_CODE_FORM = "remote-code"  # mtkit_export.json's form of an export that ships mtkit's own modeling code
FAIRSEQ_FAMILIES = {M2M100.name, MBART.name}  # the families whose own classes exporters/fairseq.py writes


def export_transformers(model_path: Path, output_dir: Path, *, quantization: str | None = None, force: bool = False) -> Path:
    """Write the Transformer of a run directory or checkpoint as a `transformers` model folder in `output_dir`;
    float32 weights only (`quantization` None: the exporters' shared signature)."""
    if quantization is not None:
        raise OptionError(
            "quantization",
            "{quantization} {value}: CTranslate2's weight types; a transformers export keeps float32",
            value=quantization,
        )
    held = check_output_dir(output_dir, force=force)
    model, config, tokenizers, payload = load_model(model_path, merged=True)  # a LoRA run: its adapters folded in
    if config.model.arch != "transformer" or not isinstance(model, Transformer):
        raise MtkitError(
            f"{model_path}: model.arch is {config.model.arch!r}; transformers has no class for mtkit's RNN models, "
            "so only Transformers are exported; translate with mtkit itself (mtkit translate / mtkit serve)"
        )
    imported = run_family(config, code_pieces(tokenizers.src))  # the family the run records, not a guess from its codes
    own = imported if imported is not None and imported.family.name in FAIRSEQ_FAMILIES else None  # NLLB, M2M-100, mBART
    if own is None:
        check_exportable(config, model_path, form="transformers")
    with staged(output_dir, held=held) as staging:
        if own is not None:
            write_fairseq_folder(staging, config, model=model, tokenizer=tokenizers.src, held=own)
            written: RunFamily | None = own
        else:
            written = write_mtkit_folder(staging, config, tokenizers=tokenizers, model=model, kept=kept_settings(payload))
        form = written.tokenizer.name if written is not None else REMOTE_CODE_FORM
        note = {"format": FORMAT, "form": form, "checkpoint": str(resolve_checkpoint(model_path))}
        write_json(staging / TRANSFORMERS_NOTE, note)
        write_file(staging / "README.md", model_card(config, model_path, tokenizers=tokenizers, written=written))
    return output_dir


def code_pieces(tokenizer: Tokenizer) -> list[str]:
    """The table's pieces of the model's language codes (deu_Latn, __de__)."""
    return [(tokenizer.table or [])[index] for index in tokenizer.codes.values()]


def write_mtkit_folder(
    folder: Path, config: Config, *, tokenizers: TokenizerPair, model: Transformer, kept: dict[str, Any]
) -> RunFamily | None:
    """Write a MarianMTModel folder, or one of mtkit's own modeling code, into `folder`; Marian's rows, or None for
    mtkit's own code. `kept`: the generation settings an imported model came with (`kept_settings`)."""
    written = RunFamily(MARIAN, MARIAN_TOKENIZER) if marian_form(config.model) else None
    weights = {name: tensor.detach().float().contiguous() for name, tensor in model.state_dict().items()}
    if written is not None:
        settings, tensors = marian_config(config, tokenizers, model=model), marian_weights(weights, config.model, model=model)
    else:
        settings, tensors = remote_config(config, tokenizers, model=model), remote_weights(weights, model)
        for path in REMOTE_CODE.glob("*_mtkit.py"):
            shutil.copyfile(path, folder / path.name)
    write_json(folder / "config.json", settings)
    write_safetensors(tensors, folder / "model.safetensors")
    write_json(folder / "generation_config.json", generation_config(config, tokenizers, kept=kept))
    write_tokenizer(folder, config, tokenizers=tokenizers)
    return written


def marian_form(model: ModelConfig) -> bool:
    """Whether MarianMTModel computes exactly what this model does (Marian's model keys: post-norm, its sinusoids)."""
    marian = all(getattr(model, key) == value for key, value in MARIAN.model_keys.items())
    return marian and model.activation in MARIAN_ACTIVATIONS


def _shared(model: Transformer) -> bool:
    """One embedding table for both sides (a joint vocabulary with tied embeddings)."""
    return model.src_embed is model.tgt_embed


def marian_config(config: Config, tokenizers: TokenizerPair, *, model: Transformer) -> dict[str, Any]:
    """config.json of a MarianMTModel computing what `model` does."""
    m = config.model
    return {
        "architectures": [MARIAN.architecture],
        "model_type": MARIAN.model_type,
        "vocab_size": tokenizers.src.vocab_size,
        "decoder_vocab_size": tokenizers.tgt.vocab_size,
        "share_encoder_decoder_embeddings": _shared(model),
        "tie_word_embeddings": m.tie_embeddings,
        "encoder_attention_heads": m.heads,
        "decoder_attention_heads": m.heads,
        "encoder_ffn_dim": m.ffn_dim,
        "decoder_ffn_dim": m.ffn_dim,
        "activation_function": MARIAN_ACTIVATIONS[m.activation],
        "activation_dropout": 0.0,
        # computed sinusoids: any length works in mtkit, and transformers sizes its table by this
        "max_position_embeddings": max(m.max_positions, SINUSOID_ROWS),
        **MARIAN.export_keys,
        **shared_keys(m),
    }


def shared_keys(m: ModelConfig) -> dict[str, Any]:
    """The keys both config.json forms name alike: sizes, dropouts and mtkit's fixed ids."""
    encoder_layers, decoder_layers = depths(m)
    return {
        "d_model": m.d_model,
        "encoder_layers": encoder_layers,
        "decoder_layers": decoder_layers,
        "dropout": m.dropout,
        "attention_dropout": m.attention_dropout,
        "is_encoder_decoder": True,
        **special_ids(),
    }


def special_ids() -> dict[str, int]:
    """mtkit's fixed ids: the decoder starts from BOS (its own row), stops at EOS; PAD pads."""
    return {"pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "bos_token_id": BOS_ID, "decoder_start_token_id": BOS_ID}


def marian_weights(weights: dict[str, torch.Tensor], m: ModelConfig, *, model: Transformer) -> dict[str, torch.Tensor]:
    """MarianMTModel's tensors from mtkit's, through the importer's table (split where mtkit fuses)."""
    out = {}
    for mine, theirs in layer_names(m):
        for name, part in zip(theirs, weights[mine].chunk(len(theirs)), strict=True):
            out[f"model.{name}"] = part.contiguous()
    if _shared(model):
        out["model.shared.weight"] = weights["src_embed.embedding.weight"]
    else:
        out["model.encoder.embed_tokens.weight"] = weights["src_embed.embedding.weight"]
        out["model.decoder.embed_tokens.weight"] = weights["tgt_embed.embedding.weight"]
    if not m.tie_embeddings:
        out["lm_head.weight"] = weights["output.weight"]
    bias = weights.get("output.bias", torch.zeros(weights["output.weight"].size(0)))
    out["final_logits_bias"] = bias.reshape(1, -1).contiguous()
    return out


def remote_config(config: Config, tokenizers: TokenizerPair, *, model: Transformer) -> dict[str, Any]:
    """config.json of the shipped modeling file (`remote_code/modeling_mtkit.py`)."""
    m = config.model
    return {
        "architectures": ["MtkitForConditionalGeneration"],
        "model_type": "mtkit-transformer",
        "auto_map": {
            "AutoConfig": "configuration_mtkit.MtkitConfig",
            "AutoModelForSeq2SeqLM": "modeling_mtkit.MtkitForConditionalGeneration",
        },
        "src_vocab_size": tokenizers.src.vocab_size,
        "tgt_vocab_size": tokenizers.tgt.vocab_size,
        "vocab_size": tokenizers.tgt.vocab_size,
        "heads": m.heads,
        "ffn_dim": m.ffn_dim,
        "norm": m.norm,
        "positions": m.positions,
        "max_positions": m.max_positions,
        "activation": m.activation,
        "tie_embeddings": m.tie_embeddings,
        "share_embeddings": _shared(model),
        "output_bias": m.output_bias,
        **shared_keys(m),
    }


def remote_weights(weights: dict[str, torch.Tensor], model: Transformer) -> dict[str, torch.Tensor]:
    """mtkit's own tensors, each stored once: the tied copies are tied again when the folder loads."""
    tied = {"output.weight"} if model.output.weight is model.tgt_embed.weight else set()
    tied |= {"tgt_embed.embedding.weight"} if _shared(model) else set()
    return {name: tensor for name, tensor in weights.items() if name not in tied}


def kept_settings(payload: dict[str, Any]) -> dict[str, Any]:
    """The generation settings an imported model came with (the import keeps them in best.pt, mtkit's ids), so
    that its export generates as the original did: EOS forced at the cap, its words never written, its cap."""
    kept = payload.get("generation") or {}
    try:
        return {key: json.loads(json.dumps(kept[key])) for key in KEPT_GENERATION if key in kept}  # plain data only
    except (TypeError, ValueError):
        raise MtkitError("the checkpoint's generation settings are not plain data; import the model again") from None


def generation_config(config: Config, tokenizers: TokenizerPair, *, kept: dict[str, Any]) -> dict[str, Any]:
    """generate()'s defaults: the recipe's beam and length penalty; never PAD, BOS or a tag (as mtkit's search); and
    what an imported model's own generation config said of the cap, the forced EOS and the words never written."""
    never = [[PAD_ID], [BOS_ID], *([tag] for tag in sorted(tokenizers.src.tags.values()) if tag < tokenizers.tgt.vocab_size)]
    return {
        **special_ids(),
        "num_beams": config.decode.beam,
        "length_penalty": config.decode.length_penalty,
        "early_stopping": True,  # a sentence ends once `num_beams` hypotheses have finished, as in mtkit
        **kept,
        "max_length": kept.get("max_length", min(MAX_LENGTH, config.model.max_positions)),
        "bad_words_ids": [*never, *(words for words in kept.get("bad_words_ids", []) if words not in never)],
    }


def write_tokenizer(folder: Path, config: Config, *, tokenizers: TokenizerPair) -> None:
    """MarianTokenizer's files: both SentencePiece models and the piece tables in mtkit's id order."""
    write_file(folder / "source.spm", tokenizers.src.model_proto)
    write_file(folder / "target.spm", tokenizers.tgt.model_proto)
    write_json(folder / "vocab.json", vocabulary(tokenizers.src))
    if not tokenizers.joint:
        write_json(folder / "target_vocab.json", vocabulary(tokenizers.tgt))
    write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": MARIAN_TOKENIZER.class_name,
            "source_lang": config.src_lang,
            "target_lang": config.tgt_lang,
            "separate_vocabs": not tokenizers.joint,
            "unk_token": "<unk>",
            "bos_token": START_PIECE,  # special, so skip_special_tokens drops it from decoded text
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "model_max_length": min(MAX_LENGTH, config.model.max_positions),
        },
    )


def vocabulary(tokenizer: Tokenizer) -> dict[str, int]:
    """{piece: id} in mtkit's ids; a tag <2fr> as >>fr<<, the language token MarianTokenizer reads (its row's code);
    BOS as <s>, the tokenizer's bos_token."""
    pieces = tokenizer.all_pieces()
    table = {}
    for index, piece in enumerate(pieces):
        match = TAG.fullmatch(piece) if index in tokenizer.tags.values() else None
        table.setdefault(START_PIECE if index == BOS_ID else MARIAN_TOKENIZER.piece(match.group(1)) if match else piece, index)
    for piece, index in (("<pad>", PAD_ID), ("<unk>", 1), ("</s>", EOS_ID)):
        if table.get(piece) != index:
            raise MtkitError(
                f"the tokenizer's piece {index} is {pieces[index]!r}, not {piece}; {MARIAN_TOKENIZER.class_name} needs "
                "<pad>, <unk> and </s> at mtkit's ids 0, 1 and 3"
            )
    return table
