"""SentencePiece training and a small encode/decode wrapper; the special ids are defined here once."""

from __future__ import annotations

import functools
import io
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from mtkit.errors import MtkitError, one_line
from mtkit.textio import write_file

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
LANGUAGE_TOKEN = re.compile(r">>[^<>\s]+<<")  # a target-language token at the start of a source, e.g. >>fra<<
TAG = re.compile(r"<2([^<>\s]+)>")  # mtkit's target-language tag, a reserved piece: <2fr>
# a fairseq-born model's language code, a piece of its table: __de__ (M2M-100), deu_Latn (NLLB-200), de_DE (mBART-50)
LANGUAGE_CODE = re.compile(r"__[a-z]{2,3}__|[a-z]{2,3}_[A-Z][A-Za-z]{1,3}")


def corpus_tag_piece(name: str) -> str:
    """The reserved piece of corpus tag `name` (`data.train[i].tag`): <bt>."""
    return f"<{name}>"


def code_name(piece: str) -> str:
    """How a language-code piece is named on the command line: de for M2M-100's __de__, the piece itself otherwise."""
    return piece[2:-2] if piece.startswith("__") and piece.endswith("__") else piece


def tag_piece(lang: str) -> str:
    """The reserved piece naming target language `lang`: <2fr>."""
    return f"<2{lang}>"


class Tokenizer:
    """One SentencePiece model: text <-> ids (without BOS/EOS; callers add them).

    With a piece table (`table`, a list whose index is the id) the ids come from the table, not
    from the SentencePiece model: how Marian/OPUS-MT models number their vocabulary (vocab.json).
    A piece missing from the table is UNK_ID. A text that starts with a language token written
    `>>xx<<` that the table holds (multi-target models such as `>>fra<<`) keeps it as one piece.
    """

    def __init__(self, model_proto: bytes, pieces: list[str] | None = None) -> None:
        self.model_proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.table = pieces
        self._ids = None if pieces is None else {piece: index for index, piece in enumerate(pieces)}

    @classmethod
    def load(cls, path: Path | str) -> Tokenizer:
        """A SentencePiece model file, with its piece table when `<path>.pieces.json` is beside it."""
        path = Path(path)
        if not path.is_file():
            raise MtkitError(f"{path}: tokenizer model not found; run `mtkit tokenizer train RECIPE` first")
        table = pieces_file(path)
        return cls(path.read_bytes(), read_pieces(table) if table.is_file() else None)

    def save(self, path: Path | str) -> None:
        write_file(path, self.model_proto)
        if self.table is not None:
            write_file(pieces_file(Path(path)), json.dumps(self.table, ensure_ascii=False).encode("utf-8"))

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size() if self.table is None else len(self.table)

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text) if self._ids is None else self._table_ids(text, self._sp.encode(text, out_type=str))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._ids is None:
            return self._sp.encode(texts)
        return [self.encode(text) for text in texts]

    def sample_batch(self, texts: list[str], alpha: float) -> list[list[int]]:
        """One sampled segmentation per text (BPE-dropout or unigram sampling), from SentencePiece's seeded generator."""
        if self._ids is None:
            return self._sp.encode(texts, enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1)
        sampled = self._sp.encode(texts, out_type=str, enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1)
        return [self._table_ids(text, pieces) for text, pieces in zip(texts, sampled, strict=True)]

    def pieces(self, text: str) -> list[str]:
        return self._sp.encode(text, out_type=str) if self.table is None else self.id_to_piece(self.encode(text))

    def id_to_piece(self, ids: Sequence[int]) -> list[str]:
        if self.table is None:
            return [self._sp.id_to_piece(int(i)) for i in ids]
        return [self.table[int(i)] for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` without PAD, BOS and EOS, trimmed as MarianTokenizer decodes it (so a `transformers`
        export gives the same text): a table piece the SentencePiece model lacks (a joint vocab.json holds both
        sides' pieces) comes back spelled out, its "\u2581" written as a space; language codes are dropped."""
        dropped = {PAD_ID, BOS_ID, EOS_ID, *self.codes.values()}
        kept = [int(i) for i in ids if int(i) not in dropped]
        if self.table is None:
            return self._sp.decode(kept).strip()
        return self._sp.decode_pieces([self.table[i] for i in kept]).replace("\u2581", " ").strip()

    @functools.cached_property
    def tags(self) -> dict[str, int]:
        """The target-language tags this tokenizer reserves (`data.lang_tag: target`): language -> id.

        A tag is a control piece: text never produces it (the text "<2fr>" is split like any other
        text), decoding drops it, and search never emits it.
        """
        if self.table is not None:
            return {}
        found = {}
        for index in range(self.vocab_size):
            if self._sp.is_control(index) and (match := TAG.fullmatch(self._sp.id_to_piece(index))):
                found[match.group(1)] = index
        return found

    @functools.cached_property
    def codes(self) -> dict[str, int]:
        """The language codes of an imported fairseq-born model's table (`data.lang_tag: code`): name -> id, e.g.
        deu_Latn, or de for M2M-100's __de__. A code is a table piece the SentencePiece model lacks: text never
        produces it; it is put in front of a source, or forced as a translation's first token, by its name."""
        if self.table is None:
            return {}
        unknown = self._sp.unk_id()
        return {
            code_name(piece): index
            for index, piece in enumerate(self.table)
            if LANGUAGE_CODE.fullmatch(piece) and self._sp.piece_to_id(piece) == unknown
        }

    def control_id(self, piece: str) -> int | None:
        """The id of reserved piece `piece` (a tag such as <bt>), or None when the model does not reserve it."""
        if self.table is not None:
            return None
        index = self._sp.piece_to_id(piece)
        return index if self._sp.id_to_piece(index) == piece and self._sp.is_control(index) else None

    @functools.cached_property
    def reserved_ids(self) -> tuple[int, ...]:
        """The control pieces other than EOS (PAD, BOS, and every tag): ids text never produces and search never emits."""
        return tuple(index for index in range(self.vocab_size) if index != EOS_ID and self._is_control(index))

    def _is_control(self, index: int) -> bool:
        return index in (PAD_ID, BOS_ID) if self.table is not None else self._sp.is_control(index)

    def all_pieces(self) -> list[str]:
        """Every piece, in id order."""
        return self.id_to_piece(range(self.vocab_size))

    def extended(self, learned: Tokenizer) -> Tokenizer:
        """This tokenizer with the pieces of `learned` it lacks added after its own (whose ids stay).

        The new pieces go into the SentencePiece model (BPE: merged after every existing piece, in
        `learned`'s order; unigram: with `learned`'s scores) and, with a piece table, into the table.
        """
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(self.model_proto)
        in_model, lowest = {piece.piece for piece in proto.pieces}, min(piece.score for piece in proto.pieces)
        known = set(self.all_pieces())
        bpe = proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE
        added: list[str] = []
        for index in range(learned.vocab_size):
            if learned._sp.is_control(index) or learned._sp.is_unknown(index) or learned._sp.is_byte(index):
                continue
            piece = learned._sp.id_to_piece(index)
            if piece not in in_model:
                entry = proto.pieces.add(piece=piece, type=sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL)
                entry.score = lowest - 1 - len(added) if bpe else learned._sp.get_score(index)
            if piece not in known:
                added.append(piece)
        table = None if self.table is None else [*self.table, *added]
        return Tokenizer(proto.SerializeToString(), table)

    def _table_ids(self, text: str, pieces: list[str]) -> list[int]:
        """Table ids of SentencePiece's pieces of `text`, after its leading language token if any."""
        assert self._ids is not None
        code = LANGUAGE_TOKEN.match(text)
        if code and code.group(0) in self._ids:
            pieces = [code.group(0), *self._sp.encode(text[code.end() :], out_type=str)]
        return [self._ids.get(piece, UNK_ID) for piece in pieces]


def pieces_file(model_path: Path) -> Path:
    """Where a tokenizer's piece table lives: beside its SentencePiece model."""
    return model_path.with_name(model_path.name + ".pieces.json")


def read_pieces(path: Path) -> list[str]:
    """A piece table (a JSON list of strings, index = id) with mtkit's four special pieces first."""
    try:
        pieces = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise MtkitError(f"{path}: not a readable piece table ({one_line(err)}); re-import the model") from None
    if not isinstance(pieces, list) or len(pieces) < 5 or not all(isinstance(piece, str) for piece in pieces):
        raise MtkitError(f"{path}: a piece table is a JSON list of at least 5 strings; re-import the model")
    return pieces


@dataclass
class TokenizerPair:
    """The source and target tokenizers (the same object when the vocabulary is joint)."""

    src: Tokenizer
    tgt: Tokenizer

    @property
    def joint(self) -> bool:
        """One id space on both sides (the model may share its embeddings): one SentencePiece model, or one piece table."""
        if self.src is self.tgt:
            return True
        if self.src.table is not None or self.tgt.table is not None:
            return self.src.table == self.tgt.table
        return self.src.model_proto == self.tgt.model_proto

    @classmethod
    def of(cls, src: Tokenizer, tgt: Tokenizer) -> TokenizerPair:
        """The pair of two loaded tokenizers; the same object twice when they are one model (joint)."""
        same = tgt.model_proto == src.model_proto and tgt.table == src.table
        return cls(src, src if same else tgt)


Tag = int | tuple[int, ...] | None  # what goes first on a source: a target-language tag, then a corpus tag


def tagged(rows: list[list[int]], tags: Tag | Sequence[Tag]) -> list[list[int]]:
    """Source ids with their tags first: the one place a tag is put on a source.

    `tags`: one tag (an id, or the ids of a language tag and a corpus tag) for every row, one per
    row, or None (an untagged model). Prepare, subword sampling and every translation path call this
    on the same encoding of the same text, so the ids a model trains on and the ids it translates are the same.
    """
    if tags is None:
        return rows
    if isinstance(tags, (int, tuple)):
        return [[*_ids(tags), *row] for row in rows]
    return [[*_ids(tag), *row] for row, tag in zip(rows, tags, strict=True)]


def _ids(tag: Tag) -> tuple[int, ...]:
    return () if tag is None else (tag,) if isinstance(tag, int) else tag


def seed_sampling(seed: int) -> None:
    """Seed SentencePiece's sampling generator (process-wide) so sampled segmentations repeat."""
    spm.set_random_generator_seed(seed % 2**32)


def reservoir_sample(items: Iterable[str], size: int, *, seed: int) -> list[str]:
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
    *,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    max_sentences: int = 2_000_000,
    seed: int = 1,
    tag_langs: Sequence[str] = (),
    corpus_tags: Sequence[str] = (),
) -> Tokenizer:
    """Train a SentencePiece model in memory with mtkit's fixed special ids.

    At most `max_sentences` non-blank sentences, a uniform sample, are read into memory.
    `tag_langs`: languages whose tags (`tag_piece`) are reserved as control pieces, with ids 4, 5, ...
    in the order given; `corpus_tags`: the corpus tags' pieces (`corpus_tag_piece`), reserved after them.
    """
    sample = reservoir_sample(sentences, max_sentences, seed=seed)
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
            **(
                {"control_symbols": reserved}
                if (reserved := [*map(tag_piece, tag_langs), *map(corpus_tag_piece, corpus_tags)])
                else {}
            ),
        )
    except RuntimeError as err:
        raise MtkitError(
            f"tokenizer: SentencePiece failed ({one_line(err, limit=400)}); try a smaller tokenizer.vocab_size"
        ) from None
    return Tokenizer(model.getvalue())


def tokenizer_files(data_dir: Path, *, joint: bool) -> tuple[Path, Path]:
    """Where the source and target models live in a data directory."""
    if joint:
        return data_dir / "spm.model", data_dir / "spm.model"
    return data_dir / "spm.src.model", data_dir / "spm.tgt.model"


def load_tokenizers(data_dir: Path, *, joint: bool) -> TokenizerPair:
    src_path, tgt_path = tokenizer_files(data_dir, joint=joint)
    src = Tokenizer.load(src_path)
    return TokenizerPair(src, src if joint else Tokenizer.load(tgt_path))
