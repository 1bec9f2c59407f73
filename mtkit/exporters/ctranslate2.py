"""`mtkit export --format ctranslate2`: a trained Transformer as a CTranslate2 model directory.

The weights are written into CTranslate2's `TransformerSpec` one by one (the way its own fairseq
and OpenNMT-py converters do), next to both SentencePiece models and `mtkit.json`, which holds
what `translate` needs (normalisation, decoding defaults, languages) and the recipe for `evaluate`.
`mtkit.decoding.ct2_engine.CT2Engine` translates with the result. An imported NLLB-200, M2M-100 or
mBART-50 model is written the same way, in mtkit's ids (its piece table beside the SentencePiece model),
with fairseq's position table, mBART's LayerNorm on the embeddings and its embedding scale; `mtkit translate`
puts its language codes in front of the source and forces the target's, as with the PyTorch engine.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import nn

from mtkit.config import Config, config_to_dict
from mtkit.data.shortlist import Shortlist
from mtkit.data.tokenizer import BOS_ID, EOS_ID, UNK_ID, Tokenizer, TokenizerPair
from mtkit.decoding.ct2_engine import MANIFEST, VOCABULARY_MAP, import_ctranslate2
from mtkit.decoding.engine import output_cap
from mtkit.decoding.shortlist import load_run_shortlist
from mtkit.errors import MtkitError
from mtkit.exporters.folder import check_output_dir, staged
from mtkit.importers.names import depths
from mtkit.models.checkpoint import load_model, resolve_checkpoint
from mtkit.models.transformer import DecoderLayer, EncoderLayer, Transformer
from mtkit.options import Quantization
from mtkit.run_files import RunFiles
from mtkit.textio import write_file

FORMAT = "mtkit-ctranslate2-1"
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
UNLIMITED = 1 << 30  # no position limit: sinusoidal tables have none in mtkit


def export_ctranslate2(model_path: Path, output_dir: Path, *, quantization: str | None = None, force: bool = False) -> Path:
    """Write the Transformer of a run directory or checkpoint as a CTranslate2 model in `output_dir`.

    quantization: None keeps float32 weights; int8, int16, float16, ... are applied by CTranslate2
    when saving. An existing non-empty `output_dir` is replaced only with `force`, and only when it
    holds an earlier export.
    """
    ctranslate2 = import_ctranslate2()
    if quantization is not None and quantization not in {q.value for q in Quantization}:
        raise MtkitError(f"--quantization {quantization}: choose one of {', '.join(q.value for q in Quantization)}")
    held = check_output_dir(output_dir, force=force)
    model, config, tokenizers, _ = load_model(model_path, merged=True)  # a LoRA run: its adapters folded in
    if config.model.arch != "transformer" or not isinstance(model, Transformer):
        raise MtkitError(
            f"{model_path}: model.arch is {config.model.arch!r}; RNN models are not supported by CTranslate2; "
            f"translate with the PyTorch engine (mtkit translate -m {model_path})"
        )
    positions = position_rows(config)
    spec = transformer_spec(ctranslate2, model.eval(), tokenizers=tokenizers, positions=positions)
    spec.validate()
    spec.optimize(quantization=quantization)
    with staged(output_dir, held=held) as staging:
        spec.save(str(staging))
        tokenizers.src.save(staging / SOURCE_SPM)
        tokenizers.tgt.save(staging / TARGET_SPM)
        shortlist = load_run_shortlist(model_path, tokenizers)
        if shortlist is not None:
            write_file(staging / VOCABULARY_MAP, vocabulary_map(shortlist, tokenizers))
        run_files = RunFiles.of(model_path)
        for learnt in (run_files.word_priors, run_files.sentence_ends):  # what the documents stage uses, as in the run
            if learnt.is_file():
                shutil.copyfile(learnt, staging / learnt.name)
        manifest = _manifest(config, resolve_checkpoint(model_path), quantization, positions)
        write_file(staging / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return output_dir


def vocabulary_map(shortlist: Shortlist, tokenizers: TokenizerPair) -> str:
    """The shortlist as CTranslate2's vocabulary map: a line per source piece, `piece TAB its target pieces`, after
    the line of the pieces every batch keeps (an empty key). A piece holding white space cannot be written: it is left out."""
    src_pieces, tgt_pieces = tokenizers.src.all_pieces(), tokenizers.tgt.all_pieces()

    def targets(ids: Iterable[int]) -> str:
        return " ".join(tgt_pieces[i] for i in ids if i >= 0 and not _spaced(tgt_pieces[i]))

    lines = ["\t" + targets(shortlist.frequent.tolist())]
    for source, row in enumerate(shortlist.candidates.tolist()):
        if row[0] >= 0 and not _spaced(src_pieces[source]):
            lines.append(f"{src_pieces[source]}\t{targets(row)}")
    return "\n".join(lines) + "\n"


def _spaced(piece: str) -> bool:
    return not piece or any(character.isspace() for character in piece)


CT2_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH"}  # model.activation -> CTranslate2's Activation


def position_rows(config: Config) -> int:
    """How many positions the exported tables hold.

    Learned positions exist for `model.max_positions` rows only. Sinusoidal ones have no limit in
    mtkit, so the table also covers the longest segment `translate` feeds (max_input_tokens + EOS)
    and the longest output it allows for it (plus BOS): no cap binds that mtkit would not apply.
    """
    if config.model.positions == "learned":
        return config.model.max_positions
    longest_source = config.decode.max_input_tokens + 1
    return max(config.model.max_positions, longest_source, output_cap(longest_source, config.decode, max_positions=UNLIMITED) + 1)


def transformer_spec(ctranslate2: ModuleType, model: Transformer, *, tokenizers: TokenizerPair, positions: int) -> Any:
    """A filled `ctranslate2.specs.TransformerSpec` for an mtkit Transformer (weights as float32 arrays)."""
    pre_norm = model.encoder_layers[0].attention_block.pre_norm
    heads = model.encoder_layers[0].self_attention.heads
    activation = getattr(
        ctranslate2.specs.common_spec.Activation, CT2_ACTIVATIONS[model.encoder_layers[0].feed_forward.activation]
    )
    # The attention CTranslate2 returns is fixed here: the last decoder layer's cross-attention,
    # averaged over all heads (alignment_heads 0), what mtkit aligns with by default.
    spec = ctranslate2.specs.TransformerSpec.from_config(
        (len(model.encoder_layers), len(model.decoder_layers)),
        heads,
        pre_norm=pre_norm,
        activation=activation,
        alignment_layer=-1,
        alignment_heads=0,
        layernorm_embedding=not isinstance(model.src_embed_norm, nn.Identity),  # mBART's LayerNorm on the embeddings
    )
    # Special pieces are the tokenizer's own at mtkit's fixed ids; decoding starts from BOS.
    src_pieces, tgt_pieces = _pieces(tokenizers.src), _pieces(tokenizers.tgt)
    for name, special_id in (("unk", UNK_ID), ("bos", BOS_ID), ("eos", EOS_ID)):
        if src_pieces[special_id] != tgt_pieces[special_id]:
            raise MtkitError(
                f"source and target tokenizers name id {special_id} differently; retrain them with `mtkit tokenizer train`"
            )
        setattr(spec.config, f"{name}_token", tgt_pieces[special_id])
    spec.config.decoder_start_token = tgt_pieces[BOS_ID]
    spec.config.add_source_eos = True  # the encoder reads `pieces + EOS`, as in training
    spec.config.layer_norm_epsilon = model.encoder_layers[0].attention_block.norm.eps
    spec.register_source_vocabulary(src_pieces)
    spec.register_target_vocabulary(tgt_pieces)

    with torch.no_grad():
        encoder, decoder = spec.encoder, spec.decoder
        _set_embeddings(encoder, decoder, model, positions)
        for layer_spec, layer in zip(encoder.layer, model.encoder_layers, strict=True):
            _set_encoder_layer(layer_spec, layer)
        for layer_spec, layer in zip(decoder.layer, model.decoder_layers, strict=True):
            _set_decoder_layer(layer_spec, layer)
        if pre_norm:
            _set_layer_norm(encoder.layer_norm, model.encoder_norm)
            _set_layer_norm(decoder.layer_norm, model.decoder_norm)
        _set_linear(decoder.projection, model.output)  # tied weights are stored once (spec aliases); the bias if any
    return spec


def _set_embeddings(encoder: Any, decoder: Any, model: Transformer, positions: int) -> None:
    """Both sides' tokens, positions and (mBART's) LayerNorm on their sum."""
    # ScaledEmbedding: x sqrt(d_model), or as they are (an imported mBART-50's `scale_embedding: false`)
    encoder.scale_embeddings = decoder.scale_embeddings = model.src_embed.scale != 1.0
    encoder.embeddings[0].weight = _array(model.src_embed.weight)
    decoder.embeddings.weight = _array(model.tgt_embed.weight)
    # mtkit's own tables: CTranslate2's built-in sinusoids use another layout (sin half, then cos half).
    encoder.position_encodings.encodings = _array(model.src_positions(positions))
    decoder.position_encodings.encodings = _array(model.tgt_positions(positions))
    if not isinstance(model.src_embed_norm, nn.Identity):
        _set_layer_norm(encoder.layernorm_embedding, model.src_embed_norm)
        _set_layer_norm(decoder.layernorm_embedding, model.tgt_embed_norm)


def _set_encoder_layer(spec: Any, layer: EncoderLayer) -> None:
    _set_layer_norm(spec.self_attention.layer_norm, layer.attention_block.norm)
    _set_linear(spec.self_attention.linear[0], layer.self_attention.qkv)  # fused q, k, v: the same order
    _set_linear(spec.self_attention.linear[1], layer.self_attention.out)
    _set_feed_forward(spec.ffn, layer)


def _set_decoder_layer(spec: Any, layer: DecoderLayer) -> None:
    _set_layer_norm(spec.self_attention.layer_norm, layer.self_block.norm)
    _set_linear(spec.self_attention.linear[0], layer.self_attention.qkv)
    _set_linear(spec.self_attention.linear[1], layer.self_attention.out)
    _set_layer_norm(spec.attention.layer_norm, layer.cross_block.norm)
    _set_linear(spec.attention.linear[0], layer.cross_attention.query)
    _set_linear(spec.attention.linear[1], layer.cross_attention.key_value)  # fused k, v: the same order
    _set_linear(spec.attention.linear[2], layer.cross_attention.out)
    _set_feed_forward(spec.ffn, layer)


def _set_feed_forward(spec: Any, layer: EncoderLayer | DecoderLayer) -> None:
    _set_layer_norm(spec.layer_norm, layer.ffn_block.norm)
    _set_linear(spec.linear_0, layer.feed_forward.inner)  # the activation is the spec's (from_config)
    _set_linear(spec.linear_1, layer.feed_forward.outer)


def _set_linear(spec: Any, linear: nn.Linear) -> None:
    spec.weight = _array(linear.weight)  # (out, in), as CTranslate2 stores it
    if linear.bias is not None:
        spec.bias = _array(linear.bias)


def _set_layer_norm(spec: Any, norm: nn.Module) -> None:
    if not isinstance(norm, nn.LayerNorm):
        raise MtkitError(f"expected a LayerNorm, found {type(norm).__name__}; this model cannot be exported")
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy().copy()


def _pieces(tokenizer: Tokenizer) -> list[str]:
    """The vocabulary in id order, so CTranslate2's token ids are mtkit's."""
    return tokenizer.id_to_piece(range(tokenizer.vocab_size))


def _manifest(config: Config, checkpoint: Path, quantization: str | None, positions: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "exported_from": str(checkpoint),
        "quantization": quantization or "float32",
        "src_lang": config.src_lang,
        "tgt_lang": config.tgt_lang,
        "normalize": config.data.normalize,
        "max_positions": positions,
        # the decoder layer of CTranslate2's attention (heads averaged)
        "alignment_layer": depths(config.model)[1] - 1,
        "tokenizers": {"src": SOURCE_SPM, "tgt": TARGET_SPM},
        "decode": asdict(config.decode),
        "recipe": config_to_dict(config),  # for `mtkit evaluate -m DIR --split test`
    }
