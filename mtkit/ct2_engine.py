"""Translating with a CTranslate2 export (`mtkit export`): the `ctranslate2` engine of `mtkit.translate`.

    from mtkit import Translator
    Translator.load("exports/multi30k_int8").translate(["Ein Hund läuft."])

The `Translator` pipeline normalises, splits, batches and caps the inputs exactly as for the PyTorch
engine. CTranslate2's `max_decoding_length` holds for a whole call, so each call holds the sources
of a batch that share one output cap, which keeps the cap exact per sentence (with `max_len_a: 0`,
one call holds the whole batch).

Where the engines can differ (besides float rounding): at the cap CTranslate2 does not force EOS,
so beam search may keep fewer (or other) capped hypotheses than mtkit (greedy is unaffected); and
with length penalty 0 CTranslate2's beam search also waits for its best beam to finish, where mtkit
stops at `beam` finished hypotheses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mtkit.config import config_from_dict
from mtkit.errors import MtkitError, one_line
from mtkit.export import MANIFEST, import_ctranslate2
from mtkit.runtime import cpu_cores
from mtkit.search import Hypothesis, length_penalty
from mtkit.tokenizer import EOS_ID, Tokenizer, TokenizerPair
from mtkit.translate import Capability, Engine, Translator


def is_ctranslate2_export(path: Path) -> bool:
    """True for a directory written by `mtkit export --format ctranslate2`."""
    return (path / MANIFEST).is_file() and (path / "model.bin").is_file()


class CT2Engine(Engine):
    """A `ctranslate2.Translator` behind the engine interface (Transformer exports, CPU or CUDA)."""

    name = "ctranslate2"
    capabilities = frozenset({Capability.NBEST})
    alternative = "use the PyTorch engine: mtkit translate -m RUN_DIR (the run directory the export came from)"

    def __init__(self, model: Any, tokenizers: TokenizerPair, max_positions: int, batch_tokens: int) -> None:
        self.model = model  # a ctranslate2.Translator
        self.max_positions = max_positions  # rows of the exported position tables
        self.batch_tokens = batch_tokens
        self._source_pieces = tokenizers.src.id_to_piece(range(tokenizers.src.vocab_size))
        self._target_pieces = tokenizers.tgt.id_to_piece(range(tokenizers.tgt.vocab_size))
        self._target_ids = {piece: index for index, piece in enumerate(self._target_pieces)}

    def search(self, sources: list[list[int]], max_len: list[int], beam: int, nbest: int, alpha: float) -> list[list[Hypothesis]]:
        """One CTranslate2 call per output cap among the batch's sources."""
        found: list[list[Hypothesis]] = [[] for _ in sources]
        by_cap: dict[int, list[int]] = {}
        for index, cap in enumerate(max_len):
            by_cap.setdefault(cap, []).append(index)
        for cap, indices in sorted(by_cap.items(), reverse=True):
            batch = [[self._source_pieces[i] for i in sources[index]] for index in indices]
            for index, hypotheses in zip(indices, self._translate(batch, cap, beam, alpha), strict=True):
                found[index] = hypotheses[:nbest]
        return found

    def _translate(self, batch: list[list[str]], max_len: int, beam: int, alpha: float) -> list[list[Hypothesis]]:
        """Translate source pieces that share the output cap `max_len` (tokens, EOS not counted)."""
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
            max_batch_size=max(1, self.batch_tokens // beam),
            batch_type="tokens",
        )
        return [self._finish(source, result, max_len, alpha) for source, result in zip(batch, results, strict=True)]

    def _finish(self, source: list[str], result: Any, max_len: int, alpha: float) -> list[Hypothesis]:
        """A sentence's hypotheses, ranked (ids without EOS).

        CTranslate2 ends a hypothesis that reaches the cap with whatever token comes next; mtkit
        forces EOS after `max_len` tokens. Such hypotheses are cut to `max_len` tokens and scored
        again with that EOS, so their score is mtkit's.
        """
        finished: dict[tuple[str, ...], float] = {}
        capped: list[tuple[str, ...]] = []
        eos = self._target_pieces[EOS_ID]
        for pieces, score in zip(result.hypotheses, result.scores, strict=True):
            if pieces and pieces[-1] == eos:
                finished[tuple(pieces[:-1])] = score
            else:
                capped.append(tuple(pieces[:max_len]))
        targets = [list(pieces) for pieces in dict.fromkeys(capped) if pieces not in finished]
        if targets:
            scored = self.model.score_batch([source] * len(targets), targets, max_input_length=0)
            for pieces, scoring in zip(targets, scored, strict=True):
                finished[tuple(pieces)] = sum(scoring.log_probs) / length_penalty(len(pieces) + 1, alpha)
        ranked = sorted(finished.items(), key=lambda item: item[1], reverse=True)
        return [self._hypothesis(pieces, score, alpha) for pieces, score in ranked]

    def _hypothesis(self, pieces: tuple[str, ...], score: float, alpha: float) -> Hypothesis:
        tokens = [self._target_ids[piece] for piece in pieces]
        return Hypothesis(tokens, score, score * length_penalty(len(tokens) + 1, alpha))


def load_export(directory: Path | str, device: str = "cpu", compute_type: str = "default", threads: int = 0) -> Translator:
    """A translator over an export directory. device: auto, cpu, cuda or cuda:N; threads 0 = one per core.

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
    tokenizers = TokenizerPair.of(
        Tokenizer.load(directory / manifest["tokenizers"]["src"]), Tokenizer.load(directory / manifest["tokenizers"]["tgt"])
    )
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
        raise MtkitError(f"{directory}: CTranslate2 cannot load it ({one_line(err)})") from None
    recipe = config_from_dict(manifest["recipe"], source=str(directory / MANIFEST), saved=True)
    decode = config_from_dict({"decode": manifest["decode"]}, source=str(directory / MANIFEST), saved=True).decode
    engine = CT2Engine(model, tokenizers, manifest["max_positions"], decode.batch_tokens)
    return Translator(engine, tokenizers, decode, manifest["normalize"], recipe)
