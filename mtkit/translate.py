"""Text in, text out: the engine behind `translate`, `evaluate`, validation and the Python API.

    from mtkit import Translator
    Translator.load("runs/multi30k_transformer").translate(["Ein Hund läuft."])

Inputs are normalised as in training, sorted by length into token-budget batches, decoded with
beam search (greedy for beam 1), detokenised and returned in input order, one output per input.
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import torch
from tqdm import tqdm

from mtkit.checkpoint import load_model
from mtkit.config import Config, DecodeConfig
from mtkit.models import EncoderDecoder
from mtkit.runtime import resolve_device
from mtkit.search import beam_search, greedy_search
from mtkit.tokenizer import BOS_ID, EOS_ID, PAD_ID, TokenizerPair


@dataclass
class Translation:
    text: str
    score: float
    tokens: list[int]


class Translator:
    """A trained model with its tokenizers and decoding defaults."""

    def __init__(
        self,
        model: EncoderDecoder,
        tokenizers: TokenizerPair,
        decode: DecodeConfig,
        normalize: str = "NFC",
        device: torch.device | None = None,
    ) -> None:
        self.device = device or torch.device("cpu")
        self.model = model.to(self.device).eval()
        self.tokenizers = tokenizers
        self.decode = decode
        self.normalize = normalize
        self.split_lines = 0  # lines longer than decode.max_input_tokens, translated in segments
        self.config: Config | None = None  # the training recipe, when loaded from a run

    @classmethod
    def load(cls, path: Path | str, device: str = "auto") -> Translator:
        """Load a run directory (its best.pt, else last.pt) or a checkpoint file."""
        model, config, tokenizers, _ = load_model(Path(path))
        translator = cls(model, tokenizers, config.decode, config.data.normalize, resolve_device(device))
        translator.config = config
        return translator

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
        """The `nbest` best translations of each line (best first)."""
        beam = beam or self.decode.beam
        alpha = self.decode.length_penalty if length_penalty is None else length_penalty
        nbest = min(nbest, beam)
        # 1. Encode; a line longer than the model should take becomes several segments.
        segments_of_line = [self._segments(line) for line in lines]
        sources = [segment for segments in segments_of_line for segment in segments]
        # 2. Decode every segment in length-sorted batches.
        found: list[list[Translation]] = [[] for _ in sources]
        bar = tqdm(total=len(sources), unit=" sent", disable=None if progress else True, file=sys.stderr)
        for indices in self._batches(list(range(len(sources))), sources, beam):
            for index, hypotheses in zip(indices, self._search(indices, sources, beam, nbest, alpha), strict=True):
                found[index] = [Translation(self.tokenizers.tgt.decode(h.tokens), h.score, h.tokens) for h in hypotheses]
            bar.update(len(indices))
        bar.close()
        # 3. Put the segments of each line back together, in input order.
        return regroup(segments_of_line, found, nbest)

    def _segments(self, line: str) -> list[list[int]]:
        """Source ids (+ EOS) of a line: none for an empty line, several for an over-long one."""
        text = clean_line(line, self.normalize)
        if not text:
            return []
        ids = self.tokenizers.src.encode(text)
        limit = min(self.decode.max_input_tokens, self.model.max_positions - 1)  # room for EOS
        if len(ids) <= limit:
            return [ids + [EOS_ID]]
        self.split_lines += 1
        cuts = split_points(self.tokenizers.src.id_to_piece(ids), limit)
        return [ids[start:end] + [EOS_ID] for start, end in pairwise(cuts)]

    def _batches(self, pending: list[int], sources: list[list[int]], beam: int) -> Iterator[list[int]]:
        """Length-sorted batches of at most decode.batch_tokens source tokens x beam."""
        ordered = sorted(pending, key=lambda i: len(sources[i]), reverse=True)
        batch: list[int] = []
        for index in ordered:
            width = len(sources[batch[0]]) if batch else len(sources[index])
            if batch and (len(batch) + 1) * width * beam > self.decode.batch_tokens:
                yield batch
                batch = []
            batch.append(index)
        if batch:
            yield batch

    @torch.inference_mode()
    def _search(self, indices: list[int], sources: list[list[int]], beam: int, nbest: int, alpha: float) -> list:
        width = max(len(sources[i]) for i in indices)
        src = torch.full((len(indices), width), PAD_ID, dtype=torch.long)
        for row, index in enumerate(indices):
            src[row, : len(sources[index])] = torch.tensor(sources[index])
        src = src.to(self.device)
        src_mask = src.ne(PAD_ID)
        lengths = src_mask.sum(dim=1)
        max_len = (lengths.float() * self.decode.max_len_a + self.decode.max_len_b).long()
        max_len = max_len.clamp(min=1, max=self.model.max_positions - 1)
        if beam == 1:
            return [[hypothesis] for hypothesis in greedy_search(self.model, src, src_mask, max_len, BOS_ID, EOS_ID)]
        return beam_search(self.model, src, src_mask, max_len, beam, alpha, nbest, BOS_ID, EOS_ID)


def clean_line(line: str, normalize: str) -> str:
    """A line as the model reads it: stripped, Unicode-normalised as in training."""
    # Lone surrogates (possible in Python strings, never in UTF-8 input) become "?".
    text = line.strip().encode("utf-8", errors="replace").decode("utf-8")
    return unicodedata.normalize(normalize, text) if normalize != "none" else text


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
