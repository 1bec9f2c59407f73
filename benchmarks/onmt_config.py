"""What benchmarks/peers.py gives OpenNMT-py 3.5.1: mtkit's pieces written as its data (the same training
pairs, test sources and vocabulary), its onmt_train options read from the recipe with what cannot be matched,
and its onmt_translate command line with mtkit's decoding settings (peers.py's docstring says why each)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtkit.config import Config
from mtkit.data.corpora import iter_split
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import UNK_ID, Tokenizer, load_tokenizers
from mtkit.textio import atomic_file, write_file
from mtkit.training.batches import IdColumn, ParallelIds


@dataclass
class PieceData:
    """mtkit's pieces written for OpenNMT-py, and the test split as mtkit reads it."""

    directory: Path
    tokenizer: Tokenizer  # the target side's, to detokenise OpenNMT-py's output
    joint: bool
    src_vocab_size: int
    tgt_vocab_size: int
    references: list[str]

    def path(self, name: str) -> Path:
        return self.directory / name


def piece_table(tokenizer: Tokenizer) -> np.ndarray:
    """Every piece of the model by id, as an array to index with id arrays."""
    return np.array(tokenizer.id_to_piece(range(tokenizer.vocab_size)), dtype=object)


def write_pieces(path: Path, column: IdColumn, table: np.ndarray) -> None:
    with atomic_file(path) as out:
        for index in range(len(column.lengths)):
            out.write(" ".join(table[column[index]]) + "\n")


def write_vocab(path: Path, table: np.ndarray) -> None:
    """OpenNMT-py's vocabulary file: the pieces after mtkit's 4 specials; OpenNMT-py adds its own 4."""
    write_file(path, "".join(f"{piece}\n" for piece in table[4:]))


def write_piece_data(config: Config, directory: Path) -> PieceData:
    """The prepared training pairs and the test sources as space-separated pieces, and the vocabularies."""
    tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    train = ParallelIds(load_prepared(config.data_path, "train"))
    directory.mkdir(parents=True, exist_ok=True)
    src_table, tgt_table = piece_table(tokenizers.src), piece_table(tokenizers.tgt)
    write_pieces(directory / "train.src", train.src, src_table)
    write_pieces(directory / "train.tgt", train.tgt, tgt_table)
    write_vocab(directory / "vocab.src", src_table)
    write_vocab(directory / "vocab.tgt", tgt_table)
    assert config.data.test is not None  # checked in check_inputs
    pairs = list(
        iter_split(
            config.data.test[0],
            config.src_lang,
            tgt_lang=config.tgt_lang,
            normalize=config.data.normalize,
            recipe_key="data.test",
        )
    )
    with atomic_file(directory / "test.src") as out:
        for ids in tokenizers.src.encode_batch([source for source, _ in pairs]):
            out.write(" ".join(src_table[ids]) + "\n")
    return PieceData(
        directory,
        tokenizers.tgt,
        tokenizers.joint,
        tokenizers.src.vocab_size,
        tokenizers.tgt.vocab_size,
        [target for _, target in pairs],
    )


def detokenise(lines: list[str], tokenizer: Tokenizer) -> list[str]:
    """OpenNMT-py's output pieces as text, through mtkit's own decode (its <unk> is mtkit's)."""
    ids = {piece: index for index, piece in enumerate(tokenizer.id_to_piece(range(tokenizer.vocab_size)))}
    return [tokenizer.decode([ids.get(piece, UNK_ID) for piece in line.split()]) for line in lines]


def onmt_options(config: Config, data: PieceData, run: Path, steps: int, report_every: int, save_every: int, extra: dict) -> dict:
    """onmt_train's options for the recipe's model and training settings (see the module docstring), then `extra`."""
    model, train = config.model, config.train
    tied = model.tie_embeddings and data.joint
    return {
        "data": {"corpus_1": {"path_src": str(data.path("train.src")), "path_tgt": str(data.path("train.tgt"))}},
        "src_vocab": str(data.path("vocab.src")),
        "tgt_vocab": str(data.path("vocab.tgt")),
        "share_vocab": data.joint,
        "src_vocab_size": data.src_vocab_size,
        "tgt_vocab_size": data.tgt_vocab_size,
        "vocab_size_multiple": 1,
        "save_model": str(run / "model"),
        "save_checkpoint_steps": save_every,
        "keep_checkpoint": 2,
        "train_steps": steps,
        "report_every": report_every,
        "seed": train.seed,
        "encoder_type": "transformer",
        "decoder_type": "transformer",
        "enc_layers": model.encoder_layers or model.layers,
        "dec_layers": model.decoder_layers or model.layers,
        "hidden_size": model.d_model,
        "word_vec_size": model.d_model,
        "transformer_ff": model.ffn_dim,
        "heads": model.heads,
        "dropout": [model.dropout],
        "attention_dropout": [model.attention_dropout],
        "position_encoding": True,
        "add_qkvbias": True,
        "add_ffnbias": True,
        "share_embeddings": tied,
        "share_decoder_embeddings": tied,
        "param_init": 0.0,
        "param_init_glorot": True,
        "optim": "adam",
        "adam_beta1": 0.9,
        "adam_beta2": 0.98,
        "decay_method": "noam",
        "learning_rate": train.lr * math.sqrt(model.d_model * train.warmup_steps),
        "warmup_steps": train.warmup_steps,
        "max_grad_norm": train.clip_norm,
        "label_smoothing": train.label_smoothing,
        "batch_type": "tokens",
        "batch_size": train.batch_tokens,
        "batch_size_multiple": 1,
        "normalization": "tokens",
        "accum_count": [train.accumulate],
        "model_dtype": "fp32",
        **extra,
    }


def differences(config: Config) -> list[str]:
    """The recipe's settings that OpenNMT-py 3.5.1 cannot match here."""
    model, train = config.model, config.train
    found = [
        "Adam eps: OpenNMT-py 1e-8, mtkit 1e-9",
        "LayerNorm eps: OpenNMT-py 1e-6, mtkit 1e-5",
        "output layer: OpenNMT-py's has a bias (vocabulary-size more parameters), mtkit's none",
        "initialisation: OpenNMT-py draws every matrix, embeddings included, Xavier-uniform (embedding std 0.016"
        " for 8,000 x 256 before the sqrt(d_model) scale); mtkit draws embeddings from N(0, 1/d_model)",
        "batches: OpenNMT-py reads the corpus in file order and stable-sorts it by length (one bucket of up to"
        " 262,144 pairs), so the same batches recur every epoch in a new order; mtkit shuffles before sorting,"
        " so pairs of equal length form new batches every epoch",
    ]
    if model.norm == "post":
        found.append("model.norm=post: OpenNMT-py's Transformer is pre-norm only")
    if model.positions == "learned":
        found.append("model.positions=learned: OpenNMT-py 3.5.1 has sinusoidal positions only")
    if train.schedule != "inverse_sqrt":
        found.append(f"train.schedule={train.schedule}: OpenNMT-py has no such decay; noam (inverse_sqrt) used")
    if config.tokenizer.sampling_alpha:
        found.append("tokenizer.sampling_alpha: OpenNMT-py trains on the best segmentation, mtkit re-samples it each epoch")
    if any(source.weight != 1.0 for source in config.data.train):
        found.append("data.train weights: OpenNMT-py reads every prepared training pair once an epoch")
    if train.ema or train.average_last:
        found.append("train.ema / train.average_last: not used by OpenNMT-py here")
    return found


def translate_command(
    bin_dir: Path, config: Config, model: Path, source: Path, output: Path, beam: int, max_len: int
) -> list[str]:
    """onmt_translate with mtkit's decoding settings: the same cap, length penalty and batch size."""
    alpha = config.decode.length_penalty
    penalty = {0.0: "none", 1.0: "avg"}.get(alpha, "wu")  # mtkit divides by length**alpha; wu is ((5+len)/6)**alpha
    command = [str(bin_dir / "onmt_translate"), "-model", str(model), "-src", str(source), "-output", str(output)]
    command += ["-beam_size", str(beam), "-max_length", str(max_len), "-max_length_ratio", "0"]
    command += ["-length_penalty", penalty, "-alpha", str(alpha), "-gpu", "-1", "-seed", str(config.train.seed)]
    command += ["-batch_type", "tokens", "-batch_size", str(max(1, config.decode.batch_beam_tokens // beam)), "-report_time"]
    if beam == 1:
        command += ["-random_sampling_topk", "1"]  # its greedy search (argmax), not a beam of one
    return command
