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
        self.truncated = 0  # inputs cut to the model's maximum length so far
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
        sources = [self._encode(line) for line in lines]
        results: list[list[Translation]] = [[Translation("", 0.0, [])] * nbest for _ in lines]
        pending = [i for i, ids in enumerate(sources) if ids]
        bar = tqdm(total=len(pending), unit=" sent", disable=None if progress else True, file=sys.stderr)
        for indices in self._batches(pending, sources, beam):
            for index, hypotheses in zip(indices, self._search(indices, sources, beam, nbest, alpha), strict=True):
                results[index] = [Translation(self.tokenizers.tgt.decode(h.tokens), h.score, h.tokens) for h in hypotheses]
            bar.update(len(indices))
        bar.close()
        return results

    def _encode(self, line: str) -> list[int]:
        text = line.strip()
        if self.normalize != "none":
            text = unicodedata.normalize(self.normalize, text)
        if not text:
            return []
        ids = self.tokenizers.src.encode(text)
        limit = self.model.max_positions - 1  # room for EOS
        if len(ids) > limit:
            self.truncated += 1
            ids = ids[:limit]
        return ids + [EOS_ID]

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
