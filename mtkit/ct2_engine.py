"""Translating with a CTranslate2 export (`mtkit export`), under the contract of `mtkit.translate.Translator`.

    from mtkit.ct2_engine import CT2Translator
    CT2Translator.load("exports/multi30k_int8").translate(["Ein Hund läuft."])

Inputs are normalised, split and capped exactly as the PyTorch engine does: one output per input
line, in order, empty lines give empty outputs. CTranslate2's `max_decoding_length` holds for a
whole call, so each call holds the sources that share one cap `max_len_a * |src| + max_len_b`,
which keeps the cap exact per sentence (with `max_len_a: 0`, one call holds them all).
`load_translator` picks the engine for a `-m` path.

Where the engines can differ (besides float rounding): at the cap CTranslate2 does not force EOS,
so beam search may keep fewer (or other) capped hypotheses than mtkit (greedy is unaffected); and
with length penalty 0 CTranslate2's beam search also waits for its best beam to finish, where mtkit
stops at `beam` finished hypotheses.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mtkit.config import Config, DecodeConfig, config_from_dict
from mtkit.errors import MtkitError
from mtkit.export import MANIFEST, import_ctranslate2, max_output_tokens
from mtkit.runtime import cpu_cores
from mtkit.tokenizer import EOS_ID, Tokenizer, TokenizerPair
from mtkit.translate import Translation, Translator, clean_line, regroup, split_points

ENGINES = ("auto", "ctranslate2", "pytorch")


def is_ctranslate2_export(path: Path) -> bool:
    """True for a directory written by `mtkit export --format ctranslate2`."""
    return (path / MANIFEST).is_file() and (path / "model.bin").is_file()


def load_translator(path: Path, engine: str = "auto", device: str = "auto") -> Translator | CT2Translator:
    """The engine for `-m PATH`: CTranslate2 for an export (with engine auto or ctranslate2), else PyTorch."""
    if engine not in ENGINES:
        raise MtkitError(f"--engine {engine}: choose one of {', '.join(ENGINES)}")
    exported = is_ctranslate2_export(path)
    if engine == "ctranslate2" or (engine == "auto" and exported):
        return CT2Translator.load(path, device=device)
    if exported:
        raise MtkitError(f"{path}: a CTranslate2 export has no PyTorch checkpoint; use --engine ctranslate2, or -m RUN_DIR")
    return Translator.load(path, device=device)


class CT2Translator:
    """A CTranslate2 model with its tokenizers and decoding defaults; the API of `Translator`."""

    def __init__(
        self, model: Any, tokenizers: TokenizerPair, decode: DecodeConfig, normalize: str = "NFC", max_positions: int = 1024
    ) -> None:
        self.model = model  # a ctranslate2.Translator
        self.tokenizers = tokenizers
        self.decode = decode
        self.normalize = normalize
        self.max_positions = max_positions  # rows of the exported position tables
        self.split_lines = 0  # lines longer than decode.max_input_tokens, translated in segments
        self.config: Config | None = None  # the training recipe, when loaded from an export
        target_pieces = tokenizers.tgt.id_to_piece(range(tokenizers.tgt.vocab_size))
        self._target_ids = {piece: index for index, piece in enumerate(target_pieces)}
        self._eos_piece = target_pieces[EOS_ID]

    @classmethod
    def load(cls, directory: Path | str, device: str = "cpu", compute_type: str = "default", threads: int = 0) -> CT2Translator:
        """Load an export directory. device: auto, cpu, cuda or cuda:N; threads 0 = one per core.

        CTranslate2's own default is 4 threads whatever the machine; on fewer cores they contend.
        """
        ctranslate2 = import_ctranslate2()
        directory = Path(directory)
        if not is_ctranslate2_export(directory):
            raise MtkitError(
                f"{directory}: not a CTranslate2 export (needs {MANIFEST} and model.bin); "
                "create one with `mtkit export -m RUN --format ctranslate2 -o DIR`"
            )
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        src = Tokenizer.load(directory / manifest["tokenizers"]["src"])
        tgt = Tokenizer.load(directory / manifest["tokenizers"]["tgt"])
        tokenizers = TokenizerPair(src, src if tgt.model_proto == src.model_proto else tgt)
        device_name, _, index = device.partition(":")
        try:
            model = ctranslate2.Translator(
                str(directory),
                device=device_name,
                device_index=int(index or 0),
                compute_type=compute_type,
                inter_threads=1,
                intra_threads=threads or cpu_cores(),
            )
        except (RuntimeError, ValueError) as err:
            raise MtkitError(f"{directory}: CTranslate2 cannot load it ({' '.join(str(err).split())[:160]})") from None
        decode = config_from_dict({"decode": manifest["decode"]}, source=str(directory / MANIFEST)).decode
        translator = cls(model, tokenizers, decode, manifest["normalize"], manifest["max_positions"])
        translator.config = config_from_dict(manifest["recipe"], source=str(directory / MANIFEST))
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
        # 1. Pieces of each line; a line longer than the model should take becomes several segments.
        segments_of_line = [self._segments(line) for line in lines]
        sources = [segment for segments in segments_of_line for segment in segments]
        # 2. Decode the segments that share a length cap in one call (the cap is per call), longest first.
        by_cap: dict[int, list[int]] = {}
        for index, source in enumerate(sources):
            by_cap.setdefault(self._max_len(len(source) + 1), []).append(index)
        found: list[list[Translation]] = [[] for _ in sources]
        bar = tqdm(total=len(sources), unit=" sent", disable=None if progress else True, file=sys.stderr)
        for max_len, indices in sorted(by_cap.items(), reverse=True):
            indices.sort(key=lambda index: len(sources[index]), reverse=True)
            batch = [sources[index] for index in indices]
            for index, hypotheses in zip(indices, self._search(batch, max_len, beam, nbest, alpha), strict=True):
                found[index] = hypotheses
            bar.update(len(indices))
        bar.close()
        # 3. Put the segments of each line back together, in input order.
        return regroup(segments_of_line, found, nbest)

    def _segments(self, line: str) -> list[list[str]]:
        """Source pieces (EOS is added by CTranslate2) of a line: none if empty, several if over-long."""
        text = clean_line(line, self.normalize)
        if not text:
            return []
        pieces = self.tokenizers.src.id_to_piece(self.tokenizers.src.encode(text))  # unknown text reads <unk>
        limit = min(self.decode.max_input_tokens, self.max_positions - 1)  # room for EOS
        if len(pieces) <= limit:
            return [pieces]
        self.split_lines += 1
        cuts = split_points(pieces, limit)
        return [pieces[start:end] for start, end in pairwise(cuts)]

    def _max_len(self, source_length: int) -> int:
        """mtkit's output cap, in tokens without EOS, for a source of `source_length` tokens (EOS included)."""
        return min(max(max_output_tokens(source_length, self.decode), 1), self.max_positions - 1)

    def _search(self, batch: list[list[str]], max_len: int, beam: int, nbest: int, alpha: float) -> list[list[Translation]]:
        """Translate sources that share the output cap `max_len` (tokens, EOS not counted)."""
        alpha = alpha if beam > 1 else 0.0  # greedy scores are total log-probabilities, as in mtkit
        results = self.model.translate_batch(
            batch,
            beam_size=beam,
            num_hypotheses=beam,  # every finished hypothesis, so the cap below can re-rank them
            length_penalty=alpha,
            max_input_length=0,  # segments are already cut to the model's positions
            max_decoding_length=max_len + 1,  # max_len tokens, then EOS
            min_decoding_length=0,
            return_scores=True,
            return_end_token=True,  # the length penalty counts the EOS, as in mtkit
            max_batch_size=max(1, self.decode.batch_tokens // beam),
            batch_type="tokens",
        )
        return [self._finish(source, result, max_len, alpha)[:nbest] for source, result in zip(batch, results, strict=True)]

    def _finish(self, source: list[str], result: Any, max_len: int, alpha: float) -> list[Translation]:
        """A sentence's hypotheses as ranked Translations (ids without EOS).

        CTranslate2 ends a hypothesis that reaches the cap with whatever token comes next; mtkit
        forces EOS after `max_len` tokens. Such hypotheses are cut to `max_len` tokens and scored
        again with that EOS, so their score is mtkit's.
        """
        finished: dict[tuple[str, ...], float] = {}
        capped: list[tuple[str, ...]] = []
        for pieces, score in zip(result.hypotheses, result.scores, strict=True):
            if pieces and pieces[-1] == self._eos_piece:
                finished[tuple(pieces[:-1])] = score
            else:
                capped.append(tuple(pieces[:max_len]))
        targets = [list(pieces) for pieces in dict.fromkeys(capped) if pieces not in finished]
        if targets:
            scored = self.model.score_batch([source] * len(targets), targets, max_input_length=0)
            for pieces, scoring in zip(targets, scored, strict=True):
                finished[tuple(pieces)] = sum(scoring.log_probs) / (len(pieces) + 1) ** alpha
        ranked = sorted(finished.items(), key=lambda item: item[1], reverse=True)
        return [self._translation(list(pieces), score) for pieces, score in ranked]

    def _translation(self, pieces: list[str], score: float) -> Translation:
        ids = [self._target_ids[piece] for piece in pieces]
        return Translation(self.tokenizers.tgt.decode(ids), score, ids)
