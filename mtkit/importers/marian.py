"""Import Hugging Face Marian (OPUS-MT) checkpoints as ordinary mtkit run directories.

The files are read directly (config.json, model.safetensors or pytorch_model.bin, source.spm,
target.spm, vocab.json and target_vocab.json), so `transformers` is not needed. Marian's
post-norm Transformer maps onto mtkit's with `norm: post`, `positions: sinusoidal_halves`,
`output_bias: true` and the feed-forward activation of the checkpoint.

Marian numbers its vocabulary by vocab.json, not by the SentencePiece models, and has no BOS: the
decoder starts from the pad piece. mtkit's ids are fixed (pad 0, unk 1, bos 2, eos 3), so the import
reorders the rows of the embeddings, output layer and logit bias: mtkit's BOS gets the row of
Marian's decoder start, PAD, UNK and EOS their own, and the other pieces follow in Marian's order.
When the decoder starts from pad, BOS and PAD share that row; the BOS logit then gets a bias of
-10,000, so its probability is exactly 0 in float32 and every log-probability is Marian's.
"""

from __future__ import annotations

import itertools
import json
import re
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtkit.config import Config, DataConfig, DecodeConfig, ModelConfig, TokenizerConfig, config_to_dict
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, TokenizerPair
from mtkit.errors import MtkitError, one_line
from mtkit.models import build_model
from mtkit.models.base import EncoderDecoder
from mtkit.models.checkpoint import checkpoint_payload, save_checkpoint
from mtkit.run_files import RunFiles

HUB_FILES = ["config.json", "generation_config.json", "tokenizer_config.json", "*.spm", "*vocab.json", "*.safetensors"]
UNREACHABLE_BIAS = -1.0e4  # the BOS logit's bias when BOS shares PAD's row: exp underflows to 0
SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # Hugging Face name -> model.activation


@dataclass
class MarianVocab:
    """One side's vocabulary: Marian's pieces in Marian's id order, and the Marian id of each mtkit id."""

    pieces: list[str]
    order: list[int]  # order[mtkit_id] = marian_id

    def table(self) -> list[str]:
        """mtkit's piece table: Marian's pieces in mtkit's id order, with '<s>' for BOS."""
        return [("<s>" if index == BOS_ID else self.pieces[marian]) for index, marian in enumerate(self.order)]

    def rows(self, matrix: Tensor) -> Tensor:
        """The rows of a (V, ...) tensor in mtkit's id order."""
        return matrix.index_select(0, torch.tensor(self.order)).float()


@dataclass
class MarianModel:
    """A Marian checkpoint read into mtkit's terms: its model keys, tokenizers and weights."""

    model: ModelConfig
    tokenizers: TokenizerPair
    source: MarianVocab
    target: MarianVocab
    weights: dict[str, Tensor]  # the checkpoint's own names, float32
    settings: dict[str, Any]  # config.json


def locate_marian(source: str) -> Path:
    """A local folder in the Hugging Face layout, or a hub id (such as Helsinki-NLP/opus-mt-de-en) downloaded to the cache."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", source):
        raise MtkitError(
            f"{source}: not a folder of a Marian model; give a folder with config.json, model.safetensors "
            "(or pytorch_model.bin), source.spm, target.spm and vocab.json, or a hub id such as Helsinki-NLP/opus-mt-de-en"
        )
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, allow_patterns=HUB_FILES))
    except Exception as err:  # ImportError, offline, unknown repository: one line, whatever the cause
        raise MtkitError(
            f"{source}: could not download it from the Hugging Face Hub ({one_line(err)}); download the model "
            "elsewhere (config.json, model.safetensors, source.spm, target.spm, vocab.json) and pass its folder"
        ) from None


def read_marian(folder: Path) -> MarianModel:
    """Read and check a Marian folder; anything mtkit cannot represent is one error naming the key or file."""
    settings = _read_json(folder / "config.json")
    model = marian_model_config(settings, folder / "config.json")
    source, target, tokenizers = _vocabularies(folder, settings)
    weights = read_weights(folder)
    return MarianModel(model, tokenizers, source, target, weights, settings)


def marian_model_config(settings: dict[str, Any], where: Path) -> ModelConfig:
    """mtkit's `model` keys for a Marian config.json; a variant mtkit cannot run is refused by its key."""
    if settings.get("model_type") != "marian":
        raise MtkitError(f"{where}: model_type is {settings.get('model_type')!r}; only Marian (OPUS-MT) models are imported")
    refusals = {
        "normalize_before": (False, "a pre-norm Marian variant"),
        "scale_embedding": (True, "unscaled embeddings"),
        "add_final_layer_norm": (False, "a final layer norm"),
        "normalize_embedding": (False, "a layer norm on the embeddings"),
    }
    for key, (wanted, what) in refusals.items():
        if settings.get(key, wanted) != wanted:
            raise MtkitError(f"{where}: {key}={json.dumps(settings[key])} ({what}) cannot be represented in mtkit")
    for encoder_key, decoder_key in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if settings.get(encoder_key) != settings.get(decoder_key):
            raise MtkitError(f"{where}: {encoder_key} and {decoder_key} differ; mtkit's encoder and decoder share them")
    activation = str(settings.get("activation_function", "swish"))
    if activation not in ACTIVATIONS:
        raise MtkitError(f"{where}: activation_function={activation!r} cannot be represented; mtkit has {', '.join(ACTIVATIONS)}")
    return ModelConfig(
        arch="transformer",
        layers=int(settings["encoder_layers"]),
        encoder_layers=int(settings["encoder_layers"]),
        decoder_layers=int(settings["decoder_layers"]),
        d_model=int(settings["d_model"]),
        heads=int(settings["encoder_attention_heads"]),
        ffn_dim=int(settings["encoder_ffn_dim"]),
        dropout=float(settings.get("dropout", 0.1)),
        attention_dropout=float(settings.get("attention_dropout", 0.0)),
        norm="post",
        positions="sinusoidal_halves",
        tie_embeddings=bool(settings.get("tie_word_embeddings", True)),
        max_positions=int(settings.get("max_position_embeddings", 1024)),
        activation=ACTIVATIONS[activation],
        output_bias=True,
    )


def _vocabularies(folder: Path, settings: dict[str, Any]) -> tuple[MarianVocab, MarianVocab, TokenizerPair]:
    """Both sides' vocabularies and mtkit tokenizers (SentencePiece models with piece tables)."""
    source_pieces = _read_vocab(folder / "vocab.json")
    separate = (folder / "target_vocab.json").is_file() and bool(settings.get("separate_vocabs", True))
    target_pieces = _read_vocab(folder / "target_vocab.json") if separate else source_pieces
    target = MarianVocab(
        target_pieces,
        _order(
            target_pieces,
            folder / "config.json",
            pad=int(settings["pad_token_id"]),
            unk=_piece_id(target_pieces, "<unk>", folder / "target_vocab.json" if separate else folder / "vocab.json"),
            start=int(settings.get("decoder_start_token_id", settings["pad_token_id"])),
            eos=int(settings["eos_token_id"]),
        ),
    )
    where = folder / "vocab.json"
    if not separate:  # one table: the source takes the target's order (a source never holds the decoder start)
        _check_special(source_pieces, target, where)
        source = MarianVocab(source_pieces, target.order)
    else:
        source = MarianVocab(
            source_pieces,
            _order(
                source_pieces,
                where,
                pad=_piece_id(source_pieces, "<pad>", where),
                unk=_piece_id(source_pieces, "<unk>", where),
                start=_piece_id(source_pieces, "<pad>", where),
                eos=_piece_id(source_pieces, "</s>", where),
            ),
        )
    spm_files = [folder / "source.spm", folder / "target.spm"]
    for path in spm_files:
        if not path.is_file():
            raise MtkitError(f"{path}: missing; a Marian folder holds source.spm and target.spm beside vocab.json")
    src = Tokenizer(spm_files[0].read_bytes(), source.table())
    tgt = Tokenizer(spm_files[1].read_bytes(), target.table())
    return source, target, TokenizerPair(src, tgt)


def _check_special(pieces: list[str], target: MarianVocab, where: Path) -> None:
    """A shared vocabulary's pad and eos ids (config.json) must name its <pad> and </s> pieces."""
    pad, eos = target.order[PAD_ID], target.order[EOS_ID]
    if pieces[pad] != "<pad>" or pieces[eos] != "</s>":
        raise MtkitError(
            f"{where}: pad_token_id {pad} and eos_token_id {eos} name {pieces[pad]!r} and {pieces[eos]!r}, not <pad> and "
            "</s>; a shared vocabulary needs its special ids to name them"
        )


def _order(pieces: list[str], where: Path, pad: int, unk: int, start: int, eos: int) -> list[int]:
    """order[mtkit_id] = marian_id: pad, unk, the decoder start (BOS), eos, then every other piece in Marian's order.

    `where` names the file the ids come from, for the error when one is outside the vocabulary.
    """
    for name, index in (("pad_token_id", pad), ("eos_token_id", eos), ("decoder_start_token_id", start)):
        if not 0 <= index < len(pieces):
            raise MtkitError(
                f"{where}: {name}={index} is outside the vocabulary of {len(pieces)} pieces; "
                "the special ids must name pieces of the vocabulary"
            )
    special = {pad, unk, start, eos}
    return [pad, unk, start, eos, *(index for index in range(len(pieces)) if index not in special)]


def _piece_id(pieces: list[str], piece: str, where: Path) -> int:
    if piece not in pieces:
        raise MtkitError(f"{where}: has no {piece} piece; a Marian vocabulary holds </s>, <unk> and <pad>")
    return pieces.index(piece)


def _read_vocab(path: Path) -> list[str]:
    """vocab.json ({piece: id}) as a list indexed by id; the ids must be 0..n-1, each once."""
    table = _read_json(path)
    pieces: list[str | None] = [None] * len(table)
    for piece, index in table.items():
        if not isinstance(index, int) or not 0 <= index < len(table) or pieces[index] is not None:
            raise MtkitError(f"{path}: id {index!r} of {piece!r} repeats or leaves a gap; the ids must be 0 to {len(table) - 1}")
        pieces[index] = piece
    return [piece for piece in pieces if piece is not None]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MtkitError(
            f"{path}: missing; a Marian folder holds config.json, the weights, the .spm models and vocab.json"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise MtkitError(f"{path}: not readable JSON ({one_line(err)})") from None
    if not isinstance(data, dict):
        raise MtkitError(f"{path}: expected a JSON object")
    return data


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors as float32, from model.safetensors or else pytorch_model.bin."""
    safetensors, pickled = folder / "model.safetensors", folder / "pytorch_model.bin"
    if safetensors.is_file():
        weights = read_safetensors(safetensors)
    elif pickled.is_file():
        try:
            with warnings.catch_warnings():  # transformers pickles with protocol 4, which torch.load reads but warns about
                warnings.filterwarnings("ignore", message="Detected pickle protocol")
                weights = torch.load(pickled, map_location="cpu", weights_only=True)
        except Exception as err:  # unpickling errors of every kind: one line
            raise MtkitError(f"{pickled}: not a readable weights file ({one_line(err)})") from None
    else:
        raise MtkitError(f"{folder}: no model.safetensors or pytorch_model.bin; download the model's weights into it")
    return {name.removeprefix("model."): tensor.float() for name, tensor in weights.items() if tensor.is_floating_point()}


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """A .safetensors file: an 8-byte little-endian header size, a JSON header, then the raw tensors."""
    data = path.read_bytes()
    try:
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + size])
        base, tensors = 8 + size, {}
        for name, entry in header.items():
            if name == "__metadata__" or entry["dtype"] not in SAFETENSORS_DTYPES:
                continue
            start, end = entry["data_offsets"]
            if not 0 <= start <= end <= len(data) - base:
                raise ValueError(f"{name}'s data lies outside the file")
            raw = bytearray(data[base + start : base + end])
            flat = torch.frombuffer(raw, dtype=SAFETENSORS_DTYPES[entry["dtype"]]) if raw else torch.empty(0)
            tensors[name] = flat.reshape(entry["shape"])
    except (struct.error, ValueError, KeyError, TypeError, RuntimeError) as err:
        raise MtkitError(f"{path}: not a readable safetensors file ({one_line(err)})") from None
    return tensors


def build_imported(marian: MarianModel) -> EncoderDecoder:
    """An mtkit Transformer holding the Marian weights (checked by `load_state_dict`, strict)."""
    tokenizers = marian.tokenizers
    model = build_model(marian.model, tokenizers.src.vocab_size, tokenizers.tgt.vocab_size, tokenizers.joint)
    try:
        model.load_state_dict(mtkit_weights(marian))
    except RuntimeError as err:
        raise MtkitError(f"the weights do not fit config.json ({one_line(err, limit=300)})") from None
    return model


def mtkit_weights(marian: MarianModel) -> dict[str, Tensor]:
    """mtkit's state dict from Marian's tensors, rows of the vocabulary in mtkit's id order."""
    weights, source, target = marian.weights, marian.source, marian.target
    shared = weights.get("shared.weight")
    encoder_embed = _tensor(weights, "encoder.embed_tokens.weight", shared)
    decoder_embed = _tensor(weights, "decoder.embed_tokens.weight", shared)
    state = {"src_embed.embedding.weight": source.rows(encoder_embed), "tgt_embed.embedding.weight": target.rows(decoder_embed)}
    head = weights.get("lm_head.weight") if not marian.model.tie_embeddings else None
    state["output.weight"] = target.rows(decoder_embed if head is None else head)
    bias = target.rows(_tensor(weights, "final_logits_bias", torch.zeros(1, len(target.pieces))).reshape(-1))
    if target.order[BOS_ID] == target.order[PAD_ID]:
        bias[BOS_ID] = UNREACHABLE_BIAS
    state["output.bias"] = bias
    for mine, theirs in layer_names(marian.model):
        state[mine] = torch.cat([_tensor(weights, name) for name in theirs])
    if marian.tokenizers.joint and marian.model.tie_embeddings and not torch.equal(encoder_embed, decoder_embed):
        raise MtkitError("config.json: share_encoder_decoder_embeddings=false with one vocabulary cannot be represented")
    return state


# The one table of names between mtkit's Transformer layers and Marian's (transformers' MarianMTModel),
# read by this importer and by mtkit.exporters.transformers: mtkit's parameter <- Marian's, joined
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


def layer_names(model: ModelConfig) -> list[tuple[str, tuple[str, ...]]]:
    """Every layer parameter: (mtkit's name, the Marian names it joins), e.g.
    ("encoder_layers.0.self_attention.qkv.weight", ("encoder.layers.0.self_attn.q_proj.weight", ...))."""
    found = []
    for stack, count, table in (
        ("encoder", model.encoder_layers or model.layers, ENCODER_LAYER_NAMES),
        ("decoder", model.decoder_layers or model.layers, DECODER_LAYER_NAMES),
    ):
        for index, (mine, theirs), part in itertools.product(range(count), table.items(), ("weight", "bias")):
            found.append((f"{stack}_layers.{index}.{mine}.{part}", tuple(f"{stack}.layers.{index}.{t}.{part}" for t in theirs)))
    return found


def _tensor(weights: dict[str, Tensor], name: str, fallback: Tensor | None = None) -> Tensor:
    found = weights.get(name, fallback)
    if found is None:
        raise MtkitError(f"the weights have no tensor {name!r}; is this a Marian (MarianMTModel) checkpoint?")
    return found


def imported_config(marian: MarianModel, folder: Path, name: str) -> Config:
    """The run's config: Marian's model keys, its languages and beam, text passed to SentencePiece as it is."""
    languages = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    generation = _read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
    beam = generation.get("num_beams", marian.settings.get("num_beams", 5))
    return Config(
        name=name,
        src_lang=str(languages.get("source_lang") or "src"),
        tgt_lang=str(languages.get("target_lang") or "tgt"),
        data=DataConfig(normalize="none"),  # SentencePiece's own normaliser, as MarianTokenizer does
        tokenizer=TokenizerConfig(joint=False, vocab_size=marian.tokenizers.src.vocab_size),
        model=marian.model,
        decode=DecodeConfig(beam=int(beam) if isinstance(beam, int) and beam >= 1 else 5),
    )


def import_marian(source: str, output: Path) -> tuple[Config, EncoderDecoder]:
    """`mtkit import marian`: a run directory (best.pt, config.yaml) that every mtkit command accepts."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise MtkitError(f"{output}: exists and is not an empty directory; choose another -o")
    folder = locate_marian(source)
    marian = read_marian(folder)
    model = build_imported(marian)
    config = imported_config(marian, folder, name=output.name or "imported")
    config.run_dir = str(output)
    progress = {"step": 0, "best_bleu": -1.0}  # nothing validated yet: `mtkit evaluate` measures it
    payload = checkpoint_payload(config, marian.tokenizers, model.state_dict(), progress=progress, imported_from=source)
    files = RunFiles(output)
    save_checkpoint(payload, files.best)
    files.write_config(config_to_dict(config))
    return config, model
