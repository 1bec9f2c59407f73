"""SentencePiece training and a small encode/decode wrapper; the special ids are defined here once."""

from __future__ import annotations

import io
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from mtkit.errors import MtkitError, one_line
from mtkit.textio import write_file

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3


class Tokenizer:
    """One SentencePiece model: text <-> ids (without BOS/EOS; callers add them)."""

    def __init__(self, model_proto: bytes) -> None:
        self.model_proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)

    @classmethod
    def load(cls, path: Path | str) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise MtkitError(f"{path}: tokenizer model not found; run `mtkit tokenizer train RECIPE` first")
        return cls(path.read_bytes())

    def save(self, path: Path | str) -> None:
        write_file(path, self.model_proto)

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._sp.encode(texts)

    def sample_batch(self, texts: list[str], alpha: float) -> list[list[int]]:
        """One sampled segmentation per text (BPE-dropout or unigram sampling), from SentencePiece's seeded generator."""
        return self._sp.encode(texts, enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1)

    def pieces(self, text: str) -> list[str]:
        return self._sp.encode(text, out_type=str)

    def id_to_piece(self, ids: Sequence[int]) -> list[str]:
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids if int(i) not in (PAD_ID, BOS_ID, EOS_ID)])


@dataclass
class TokenizerPair:
    """The source and target tokenizers (the same object when the vocabulary is joint)."""

    src: Tokenizer
    tgt: Tokenizer

    @property
    def joint(self) -> bool:
        return self.src is self.tgt or self.src.model_proto == self.tgt.model_proto

    @classmethod
    def of(cls, src: Tokenizer, tgt: Tokenizer) -> TokenizerPair:
        """The pair of two loaded tokenizers; the same object twice when they are one model (joint)."""
        return cls(src, src if tgt.model_proto == src.model_proto else tgt)


def seed_sampling(seed: int) -> None:
    """Seed SentencePiece's sampling generator (process-wide) so sampled segmentations repeat."""
    spm.set_random_generator_seed(seed % 2**32)


def reservoir_sample(items: Iterable[str], size: int, seed: int) -> list[str]:
    """A uniform random sample of `size` non-blank items (all of them if fewer) in one pass.

    Memory holds the sample only, whatever the stream's length (Vitter's algorithm R, seeded).
    """
    rng = random.Random(seed)
    sample: list[str] = []
    seen = 0
    for item in items:
        if not item.strip():
            continue
        seen += 1
        if len(sample) < size:
            sample.append(item)
        else:
            slot = rng.randrange(seen)
            if slot < size:
                sample[slot] = item
    return sample


def train_sentencepiece(
    sentences: Iterable[str],
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    max_sentences: int = 2_000_000,
    seed: int = 1,
) -> Tokenizer:
    """Train a SentencePiece model in memory with mtkit's fixed special ids.

    At most `max_sentences` non-blank sentences, a uniform sample, are read into memory.
    """
    sample = reservoir_sample(sentences, max_sentences, seed)
    if not sample:
        raise MtkitError("tokenizer: the training text is empty; check data.train in the recipe")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            input_sentence_size=0,  # already sampled above
            shuffle_input_sentence=True,
            num_threads=2,
            hard_vocab_limit=False,
            minloglevel=2,
        )
    except RuntimeError as err:
        raise MtkitError(
            f"tokenizer: SentencePiece failed ({one_line(err, limit=400)}); try a smaller tokenizer.vocab_size"
        ) from None
    return Tokenizer(model.getvalue())


def tokenizer_files(data_dir: Path, joint: bool) -> tuple[Path, Path]:
    """Where the source and target models live in a data directory."""
    if joint:
        return data_dir / "spm.model", data_dir / "spm.model"
    return data_dir / "spm.src.model", data_dir / "spm.tgt.model"


def load_tokenizers(data_dir: Path, joint: bool) -> TokenizerPair:
    src_path, tgt_path = tokenizer_files(data_dir, joint)
    src = Tokenizer.load(src_path)
    return TokenizerPair(src, src if joint else Tokenizer.load(tgt_path))
