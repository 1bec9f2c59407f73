"""A run's vocabulary shortlist: built from its training corpus (`mtkit shortlist RUN`), and used by search.

Once per batch, the union of its sources' shortlists, with the pieces its prefixes and constraints need,
EOS and the special pieces, becomes the batch's vocabulary (`BatchVocabulary`). Search then runs over
`ShortlistedModel`: the model's contract in that reduced space, whose decoder reads the reduced ids back
as the model's own and computes only those rows of its output layer (`mtkit.models.base.OutputRows`).
Each step's log-probabilities are normalised over the batch's vocabulary (as Marian's shortlists and
CTranslate2's vocabulary map do), so a hypothesis's score is the model's given that vocabulary; `mtkit score`
never uses a shortlist.

`mtkit priors RUN` reads the same training pairs (`corpus_texts`) for eflomal's word-alignment priors
(`build_word_priors`), with which the documents stage places inline tags, and for where sentences end.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mtkit.config import Config, config_from_dict
from mtkit.data.shortlist import MOST_K, Shortlist, align_pieces, shortlist_from_links
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, TokenizerPair
from mtkit.data.word_alignment import TOKEN, corpus_priors
from mtkit.decoding.options import ShortlistBuild
from mtkit.errors import MtkitError, OptionError
from mtkit.models.base import DecoderState, EncoderDecoder, OutputRows, padding_hint
from mtkit.models.checkpoint import checkpoint_tokenizers, read_checkpoint
from mtkit.models.packed import row_bucket
from mtkit.run_files import RunFiles
from mtkit.textio import file_lines, model_text

SAMPLE_SEED = 1  # which training pairs a shortlist aligns, when the corpus holds more than --lines


def build_shortlist(run: Path, build: ShortlistBuild) -> Shortlist:
    """The shortlist of run directory `run`, from eflomal's alignments of its prepared training pairs (a sample of
    `build.lines`), or of the parallel corpus `build.src`/`build.tgt`; its coverage of the validation references."""
    if not 1 <= build.k <= MOST_K:
        raise OptionError("k", "{k} {value}: give 1 to {most}, such as 100", value=build.k, most=MOST_K)
    config, tokenizers = _recipe(run)
    sources, targets = _pairs(run, config, tokenizers, build)
    shortlist = shortlist_from_links(
        sources,
        targets,
        links=align_pieces(sources, targets),
        vocabularies=(tokenizers.src.vocab_size, tokenizers.tgt.vocab_size),
        k=build.k,
        frequent=build.frequent,
        always=special_ids(tokenizers),
    )
    valid = _prepared(config, "valid", lines=None)
    coverage = round(shortlist.coverage(*valid), 4) if valid is not None and valid[0] else None
    size = float(np.mean([len(shortlist.pieces([source])) for source in (valid or (sources, targets))[0][:1000]] or [0]))
    info = shortlist.info | {"coverage": coverage, "mean_size": round(size, 1), "aligner": "eflomal"}
    return replace(shortlist, info=info)


def corpus_texts(run: Path, build: ShortlistBuild) -> tuple[list[str], list[str]]:
    """The pairs a shortlist of `run` aligns (`build.lines` of its prepared training data, or `build.src`/`build.tgt`)
    as text: what `mtkit priors` learns from."""
    config, tokenizers = _recipe(run)
    sources, targets = _pairs(run, config, tokenizers, build)
    return [tokenizers.src.decode(ids) for ids in sources], [tokenizers.tgt.decode(ids) for ids in targets]


def build_word_priors(sources: list[str], targets: list[str]) -> tuple[str, dict[str, str | int]]:
    """eflomal's word-alignment priors (`word_alignment.corpus_priors`) of the pairs of `sources` and `targets`, as
    text; and how they were built."""
    info = {"lines": len(sources), "aligner": f"eflomal {importlib.metadata.version('eflomal')}", "tokens": TOKEN.pattern}
    return corpus_priors(sources, targets), info


def _recipe(run: Path) -> tuple[Config, TokenizerPair]:
    """The recipe and tokenizers of run directory `run` (its weights stay on disk)."""
    payload = read_checkpoint(run, mmap=True)
    return config_from_dict(payload["config"], source=str(run), saved=True), checkpoint_tokenizers(payload)


def special_ids(tokenizers: TokenizerPair) -> list[int]:
    """The target ids every batch keeps: PAD, UNK, BOS, EOS, the reserved pieces (tags) and the language codes."""
    target = tokenizers.tgt
    return sorted({PAD_ID, UNK_ID, BOS_ID, EOS_ID, *target.reserved_ids, *target.codes.values()})


def describe(shortlist: Shortlist, path: Path) -> str:
    """One line for the user: where it was written, its size and coverage."""
    info = shortlist.info
    coverage = "n/a (no prepared validation split)" if info.get("coverage") is None else f"{100 * float(info['coverage']):.2f}%"
    return (
        f"{path}: {info['lines']} pairs aligned, k={info['k']}, {len(shortlist.frequent)} pieces always kept; "
        f"{info['mean_size']} target pieces a sentence on average; validation target pieces covered: {coverage}"
    )


def load_run_shortlist(path: Path, tokenizers: TokenizerPair) -> Shortlist | None:
    """The shortlist of the run that `-m path` names (a run directory or a checkpoint in one), if it has one."""
    file = RunFiles.of(path).shortlist
    if not file.is_file():
        return None
    return Shortlist.load(file, src_vocab=tokenizers.src.vocab_size, tgt_vocab=tokenizers.tgt.vocab_size)


def _pairs(
    run: Path, config: Config, tokenizers: TokenizerPair, build: ShortlistBuild
) -> tuple[list[list[int]], list[list[int]]]:
    """The id pairs to align: the given corpus's, else a sample of the run's prepared training split."""
    if (build.src is None) != (build.tgt is None):
        raise MtkitError("--src and --tgt go together: give both files of a parallel corpus, or neither")
    if build.src is not None and build.tgt is not None:
        src_lines, tgt_lines = (_first_lines(path, build.lines) for path in (build.src, build.tgt))
        if len(src_lines) != len(tgt_lines):
            raise MtkitError(f"{build.src}: {len(src_lines)} lines, but {build.tgt} has {len(tgt_lines)}; give a parallel corpus")
        normalize = config.data.normalize
        return (
            tokenizers.src.encode_batch([model_text(line, normalize) for line in src_lines]),
            tokenizers.tgt.encode_batch([model_text(line, normalize) for line in tgt_lines]),
        )
    found = _prepared(config, "train", lines=build.lines)
    if found is None:
        raise MtkitError(
            f"{run}: its prepared training data ({config.data_path}/train) is not here (an imported model, or a run "
            "from elsewhere); give a parallel corpus with --src FILE --tgt FILE"
        )
    return found


def _first_lines(path: Path, count: int) -> list[str]:
    """The first `count` lines of a text file (read lazily: the rest is never read)."""
    if not path.is_file():
        raise MtkitError(f"{path}: no such file; give one sentence a line, the two files of a parallel corpus")
    return [line for _, line in islice(file_lines(path), count)]


def _prepared(config: Config, split: str, *, lines: int | None) -> tuple[list[list[int]], list[list[int]]] | None:
    """A prepared split's id pairs (a seeded sample of at most `lines`), or None when the split is not here."""
    if not (config.data_path / split).is_dir():
        return None
    table = load_prepared(config.data_path, split).table
    if lines is not None and table.num_rows > lines:
        chosen = np.sort(np.random.default_rng(SAMPLE_SEED).choice(table.num_rows, size=lines, replace=False))
        table = table.take(chosen)
    return table.column("src_ids").to_pylist(), table.column("tgt_ids").to_pylist()


class BatchVocabulary:
    """The target ids one batch's search may emit (`ids`, sorted), and the maps between them and the model's ids."""

    def __init__(self, ids: np.ndarray, *, vocab_size: int, device: torch.device) -> None:
        self.lookup = np.full(vocab_size, -1, dtype=np.int64)  # model id -> reduced id (-1: not kept)
        self.lookup[ids] = np.arange(len(ids))
        self.kept = ids
        self.ids = torch.from_numpy(ids).to(device)  # (V',) reduced id -> model id
        self.rows = OutputRows(self.ids)

    @classmethod
    def of(
        cls,
        shortlist: Shortlist,
        sources: Sequence[Sequence[int]],
        *,
        needed: Iterable[int],
        vocab_size: int,
        device: torch.device,
    ) -> BatchVocabulary:
        """The union of `sources`' shortlists and the `needed` ids, grown to one of a few sizes (`row_bucket`) with
        the lowest ids not yet in it, so that the output layer's cut copies take few shapes."""
        ids = np.union1d(shortlist.pieces(sources), np.fromiter(needed, dtype=np.int64))
        ids = ids[(ids >= 0) & (ids < vocab_size)]
        room = min(row_bucket(len(ids)), vocab_size) - len(ids)
        if room > 0:
            ids = np.union1d(ids, np.setdiff1d(np.arange(vocab_size), ids, assume_unique=True)[:room])
        return cls(ids, vocab_size=vocab_size, device=device)

    def reduced(self, ids: Sequence[int]) -> list[int]:
        """Model ids -> reduced ids (each must be kept)."""
        return self.lookup[np.asarray(ids, dtype=np.int64)].tolist() if len(ids) else []

    def present(self, ids: Iterable[int]) -> tuple[int, ...]:
        """The reduced ids of those of `ids` that are kept (the never-emitted ids the batch has)."""
        return tuple(int(self.lookup[i]) for i in ids if 0 <= i < len(self.lookup) and self.lookup[i] >= 0)

    def full(self, tokens: Sequence[int]) -> list[int]:
        """Reduced ids -> model ids."""
        return self.kept[np.asarray(tokens, dtype=np.int64)].tolist() if len(tokens) else []


class ShortlistedModel(EncoderDecoder):
    """`model`'s contract over a batch's vocabulary: decoder inputs and logits are in reduced ids (see the module)."""

    def __init__(self, model: EncoderDecoder, vocabulary: BatchVocabulary) -> None:
        super().__init__()
        self.model, self.vocabulary = model, vocabulary

    @property
    def max_positions(self) -> int:
        return self.model.max_positions

    @property
    def attention_layers(self) -> int:
        return self.model.attention_layers

    def encode(self, src: Tensor, src_mask: Tensor, *, src_padded: bool | None = None) -> Tensor:
        return self.model.encode(src, src_mask, **padding_hint(src_padded=src_padded))

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor,
        state: DecoderState | None = None,
        src_padded: bool | None = None,
        output_rows: OutputRows | None = None,
    ) -> tuple[Tensor, DecoderState | None]:
        """tgt (B, T) reduced ids -> logits (B, T, V') over the batch's vocabulary."""
        full = self.vocabulary.ids[tgt]  # (B, T) the model's ids
        rows = self.vocabulary.rows
        return self.model.decode(
            full, memory, src_mask=src_mask, state=state, output_rows=rows, **padding_hint(src_padded=src_padded)
        )

    def reorder_state(self, state: DecoderState, order: Tensor, *, keep_memory: bool = False) -> DecoderState:
        return self.model.reorder_state(state, order, keep_memory=keep_memory)
