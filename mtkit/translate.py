"""Text in, text out: one pipeline over any translation engine, for `translate`, `evaluate`,
validation and the Python API.

    from mtkit import Translator
    Translator.load("runs/multi30k_transformer").translate(["Ein Hund läuft."])

The pipeline is written once (`Translator`): clean each line as the model reads it, cut over-long
lines into segments, sort the segments into length batches of a token budget, let the engine
search each batch, detokenise, and put segments and lines back in input order. An `Engine` only
searches a batch of source ids and declares what else it can do (`Capability`); `Translator.load`
picks the engine for a path. A feature an engine lacks is one clear error (`Translator.require`).
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import pairwise
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from tqdm import tqdm

from mtkit.choices import EngineName
from mtkit.config import Config, DecodeConfig
from mtkit.errors import MtkitError
from mtkit.models import EncoderDecoder
from mtkit.search import Hypothesis, beam_search, greedy_search
from mtkit.textio import model_text
from mtkit.tokenizer import BOS_ID, EOS_ID, PAD_ID, TokenizerPair


class Capability(str, Enum):
    """What an engine can do beyond searching for the best translation."""

    NBEST = "n-best lists"
    ATTENTION = "attention weights"


@dataclass
class Translation:
    text: str
    score: float
    tokens: list[int]


class Engine(ABC):
    """Searches batches of source ids; the `Translator` pipeline does everything else."""

    name: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]]
    alternative: ClassVar[str]  # how to get a capability this engine lacks
    max_positions: int  # longest source or target sequence, EOS/BOS included

    @abstractmethod
    def search(self, sources: list[list[int]], max_len: list[int], beam: int, nbest: int, alpha: float) -> list[list[Hypothesis]]:
        """The `nbest` best hypotheses (best first) of each source, in batch order.

        sources: ids without EOS, longest first; max_len: most output tokens of each (EOS excluded);
        beam 1 is greedy; alpha is the length penalty's exponent.
        """


class PyTorchEngine(Engine):
    """A model of the encode / decode contract, searched by `mtkit.search` on a torch device.

    The model is used in whatever mode it is in (validation switches a training model to eval
    itself); `Translator.load` puts a loaded model in eval mode.
    """

    name = "pytorch"
    capabilities = frozenset({Capability.NBEST, Capability.ATTENTION})
    alternative = "every feature is available in the PyTorch engine"

    def __init__(self, model: EncoderDecoder, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")
        self.model = model.to(self.device)
        self.max_positions = model.max_positions

    def search(self, sources: list[list[int]], max_len: list[int], beam: int, nbest: int, alpha: float) -> list[list[Hypothesis]]:
        src = torch.full((len(sources), max(len(s) for s in sources) + 1), PAD_ID, dtype=torch.long)  # (B, S)
        for row, source in enumerate(sources):
            src[row, : len(source) + 1] = torch.tensor([*source, EOS_ID])
        src = src.to(self.device)
        src_mask = src.ne(PAD_ID)
        caps = torch.tensor(max_len, device=self.device)  # (B,)
        if beam == 1:
            return [[found] for found in greedy_search(self.model, src, src_mask, caps, BOS_ID, EOS_ID, alpha=0.0)]
        return beam_search(self.model, src, src_mask, caps, beam, alpha, nbest, BOS_ID, EOS_ID)


class Translator:
    """An engine with its tokenizers, text normalisation and decoding defaults: lines in, lines out."""

    def __init__(
        self,
        engine: Engine,
        tokenizers: TokenizerPair,
        decode: DecodeConfig,
        normalize: str = "NFC",
        config: Config | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizers = tokenizers
        self.decode = decode
        self.normalize = normalize
        self.config = config  # the training recipe, when loaded from a run or an export
        self.split_lines = 0  # lines longer than decode.max_input_tokens, translated in segments

    @classmethod
    def load(cls, path: Path | str, engine: EngineName | str = EngineName.AUTO, device: str = "auto") -> Translator:
        """A run directory (its best.pt, else last.pt), a checkpoint file, or an `mtkit export` directory."""
        from mtkit.ct2_engine import is_ctranslate2_export, load_export

        path, engine = Path(path), EngineName(engine)
        exported = is_ctranslate2_export(path)
        if engine is EngineName.CTRANSLATE2 or (engine is EngineName.AUTO and exported):
            return load_export(path, device=device)
        if exported:
            raise MtkitError(f"{path}: a CTranslate2 export has no PyTorch checkpoint; use --engine ctranslate2, or -m RUN_DIR")
        return _load_checkpoint(path, device)

    def require(self, capability: Capability, option: str) -> None:
        """One clear error when `option` needs a capability this engine lacks."""
        if capability not in self.engine.capabilities:
            engine = self.engine
            raise MtkitError(f"{option} needs {capability.value}, which the {engine.name} engine lacks; {engine.alternative}")

    def translate(self, lines: Sequence[str], beam: int | None = None, progress: bool = False) -> list[str]:
        """One output line per input line, in order; empty inputs give empty outputs."""
        return [best[0].text for best in self.translate_nbest(lines, beam=beam, nbest=1, progress=progress)]

    def translate_nbest(
        self,
        lines: Sequence[str],
        beam: int | None = None,
        nbest: int = 1,
        length_penalty: float | None = None,
        progress: bool = False,
    ) -> list[list[Translation]]:
        """The `nbest` best translations of each line (best first), in input order."""
        plan = self.plan(lines, beam, nbest, length_penalty)
        bar = tqdm(total=len(plan.sources), unit=" sent", disable=None if progress else True, file=sys.stderr)
        for batch in plan.batches():
            plan.put(batch, self.engine.search(batch.sources, batch.max_len, plan.beam, plan.nbest, plan.alpha))
            bar.update(len(batch.sources))
        bar.close()
        return plan.results()

    def plan(self, lines: Sequence[str], beam: int | None = None, nbest: int = 1, length_penalty: float | None = None) -> Plan:
        """The way of `lines` through the engine (None: the recipe's decoding default); see `Plan`."""
        beam = beam or self.decode.beam
        alpha = self.decode.length_penalty if length_penalty is None else length_penalty
        if min(nbest, beam) > 1:
            self.require(Capability.NBEST, "--nbest")
        plan = Plan([self.segments(line) for line in lines], beam, min(nbest, beam), alpha, self)
        self.split_lines += sum(len(segments) > 1 for segments in plan.segments_of_line)
        return plan

    def segments(self, line: str) -> list[list[int]]:
        """Source ids (EOS not included) of a line: none if empty, several if over-long."""
        text = model_text(line, self.normalize)
        if not text:
            return []
        ids = self.tokenizers.src.encode(text)
        limit = min(self.decode.max_input_tokens, self.engine.max_positions - 1)  # room for EOS
        if len(ids) <= limit:
            return [ids]
        cuts = split_points(self.tokenizers.src.id_to_piece(ids), limit)
        return [ids[start:end] for start, end in pairwise(cuts)]


@dataclass
class Batch:
    """Segments searched together: their places in `Plan.sources`, their ids and output caps."""

    indices: list[int]
    sources: list[list[int]]  # ids without EOS, longest first
    max_len: list[int]  # most output tokens of each, EOS excluded


class Plan:
    """One list of lines on its way through an engine, the pipeline's bookkeeping written once.

    1. `segments_of_line`: the source ids of each line (none if empty, several if over-long);
    2. `batches()`: the segments sorted by length into batches of `decode.batch_tokens` x beam;
    3. `put()` records what the engine found for a batch; `results()` detokenises and puts
       segments and lines back together, in input order.
    The caller runs the loop: `for batch in plan.batches(): plan.put(batch, engine.search(...))`.
    """

    def __init__(self, segments_of_line: list[list[list[int]]], beam: int, nbest: int, alpha: float, translator: Translator):
        self.segments_of_line = segments_of_line
        self.sources = [segment for segments in segments_of_line for segment in segments]
        self.beam, self.nbest, self.alpha = beam, nbest, alpha
        self.found: list[list[Translation]] = [[] for _ in self.sources]
        self._translator = translator

    def batches(self) -> Iterator[Batch]:
        decode, max_positions = self._translator.decode, self._translator.engine.max_positions
        for indices in length_batches([len(s) for s in self.sources], self.beam, decode.batch_tokens):
            sources = [self.sources[i] for i in indices]
            yield Batch(indices, sources, [output_cap(len(source) + 1, decode, max_positions) for source in sources])

    def put(self, batch: Batch, hypotheses: list[list[Hypothesis]]) -> None:
        detokenize = self._translator.tokenizers.tgt.decode
        for index, found in zip(batch.indices, hypotheses, strict=True):
            self.found[index] = [Translation(detokenize(h.tokens), h.score, h.tokens) for h in found]

    def results(self) -> list[list[Translation]]:
        return regroup(self.segments_of_line, self.found, self.nbest)


def _load_checkpoint(path: Path, device: str) -> Translator:
    from mtkit.checkpoint import load_model
    from mtkit.runtime import resolve_device

    model, config, tokenizers, _ = load_model(path)
    engine = PyTorchEngine(model.eval(), resolve_device(device))
    return Translator(engine, tokenizers, config.decode, config.data.normalize, config)


def output_cap(source_length: int, decode: DecodeConfig, max_positions: int) -> int:
    """The one output-length rule: at most `max_len_a * |src| + max_len_b` tokens (EOS excluded).

    |src| counts the source's EOS; the product is taken in float32, at least 1, and the output
    (with BOS) must fit the model's positions.
    """
    length = int(np.float32(source_length) * np.float32(decode.max_len_a) + np.float32(decode.max_len_b))
    return min(max(length, 1), max_positions - 1)


def length_batches(lengths: Sequence[int], beam: int, batch_tokens: int) -> Iterator[list[int]]:
    """Indices sorted by length (longest first) in batches of at most `batch_tokens` source tokens x beam."""
    batch: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True):
        width = lengths[batch[0]] + 1 if batch else lengths[index] + 1  # + EOS
        if batch and (len(batch) + 1) * width * beam > batch_tokens:
            yield batch
            batch = []
        batch.append(index)
    if batch:
        yield batch


def split_points(pieces: Sequence[str], limit: int) -> list[int]:
    """Cut positions [0, ..., len(pieces)] of segments of at most `limit` pieces.

    Each cut falls after the last sentence end (else before the last word start) in the second
    half of its window, else at the window's end.
    """
    cuts = [0]
    while len(pieces) - cuts[-1] > limit:
        start = cuts[-1]
        window = range(start + limit, start + limit // 2, -1)
        cut = next((i for i in window if pieces[i - 1].rstrip().endswith((".", "!", "?", ";"))), None)
        cuts.append(cut or next((i for i in window if pieces[i].startswith("\u2581")), start + limit))
    return [*cuts, len(pieces)]


def regroup(segments_of_line: Sequence[Sequence[object]], found: list[list[Translation]], nbest: int) -> list[list[Translation]]:
    """The translations of each line, in input order, from those of its segments (`found`, flat)."""
    results, position = [], 0
    for segments in segments_of_line:
        results.append(_join(found[position : position + len(segments)], nbest))
        position += len(segments)
    return results


def _join(parts: list[list[Translation]], nbest: int) -> list[Translation]:
    """The k-th translation of a line is its segments' k-th translations (or their best) joined."""
    if not parts:
        return [Translation("", 0.0, [])] * nbest
    if len(parts) == 1:
        return parts[0]
    joined = []
    for rank in range(max(len(p) for p in parts)):
        chosen = [p[rank] if rank < len(p) else p[0] for p in parts]
        joined.append(
            Translation(
                " ".join(t.text for t in chosen), sum(t.score for t in chosen), [token for t in chosen for token in t.tokens]
            )
        )
    return joined
