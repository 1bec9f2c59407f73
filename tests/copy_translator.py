"""A translator that needs no trained model, for the fast tier: a tiny SentencePiece model trained in memory (a piece a
character) and an engine that copies each source (its output is the source text, each target piece linked to its
source piece), so what the pipeline does around the engine (cutting, batching, joining, alignments) is seen exactly."""

from __future__ import annotations

import functools
import string

from mtkit.config import DecodeConfig
from mtkit.data.tokenizer import TokenizerPair, train_sentencepiece
from mtkit.decoding.engine import Capability, Engine, SourceBatch
from mtkit.decoding.search import Hypothesis, SearchOptions
from mtkit.decoding.translator import Translator

ALPHABET = string.ascii_letters + string.digits + ".,;:!?'\"()-äöüÄÖÜß"


class CopyEngine(Engine):
    """Each source copied as its translation (the n-th best: the copy without its last n - 1 pieces), each piece
    linked to its own source piece; `drop` lists sources (as text) whose translation stops at their first full stop;
    every searched batch is recorded."""

    name = "copy"
    capabilities = frozenset(Capability) - {Capability.SAMPLING}
    alternative = "a stub"
    max_positions = 512

    def __init__(self, tokenizers: TokenizerPair, drop: tuple[str, ...] = ()) -> None:
        self.tokenizers, self.drop, self.batches = tokenizers, drop, []

    def search(self, batch: SourceBatch, options: SearchOptions) -> list[list[Hypothesis]]:
        self.batches.append(batch)
        found = []
        for n, source in enumerate(batch.sources):
            prefix = batch.prefixes[n] if batch.prefixes is not None else []
            body = list(source)
            if self.tokenizers.src.decode(body) in self.drop:
                stops = self.tokenizers.src.id_to_piece(body)
                body = body[: stops.index(".") + 1 if "." in stops else len(body)]
            tokens = [*prefix, *body]
            found.append(
                [
                    Hypothesis(
                        tokens=tokens[: len(tokens) - rank],
                        score=-float(rank),
                        log_prob=-float(rank),
                        links=self._links(prefix, body, rank),
                        source_links=[len(prefix) + position for position in range(len(source))],  # each to its copy
                    )
                    for rank in range(options.nbest)
                ]
            )
        return found

    @staticmethod
    def _links(prefix: list[int], body: list[int], rank: int) -> list[int]:
        links = [0] * len(prefix) + list(range(len(body)))
        return links[: len(links) - rank]

    def score(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        return [[0.0] * (len(target) + 1) for target in targets]

    def check_alignment_layer(self, layer: int) -> None:
        return None


@functools.cache
def copy_tokenizers() -> TokenizerPair:
    """A character-level SentencePiece model (joint): every letter, digit and mark of ALPHABET is one piece."""
    lines = [" ".join(ALPHABET[start:] + ALPHABET[:start]) for start in range(len(ALPHABET))]
    tokenizer = train_sentencepiece(lines, vocab_size=len(ALPHABET) + 8, model_type="char")
    return TokenizerPair(tokenizer, tokenizer)


def copy_translator(*, drop: tuple[str, ...] = (), **decode: object) -> Translator:
    """A Translator over `CopyEngine` (decode: `DecodeConfig` fields, such as max_input_tokens or split_by)."""
    tokenizers = copy_tokenizers()
    return Translator(CopyEngine(tokenizers, drop), tokenizers, decode=DecodeConfig(**decode), normalize="NFC")
