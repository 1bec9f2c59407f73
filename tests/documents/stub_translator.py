"""A translator for the documents stage's tests: each word "translated" by upper-casing it, in the same order, each
aligned to its source word, so a test knows the exact output of every block without a model."""

from __future__ import annotations

from collections.abc import Sequence

from mtkit.config import DecodeConfig
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translation


def stub_translation(text: str) -> Translation:
    words = text.split()
    return Translation(text=" ".join(word.upper() for word in words), score=0.0, tokens=[],
                       alignment=[(index, index) for index in range(len(words))])  # fmt: skip


class StubTranslator:
    """What `pipeline.translate_blocks` asks of a `Translator`; it records the texts it was given."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.decode, self.config = DecodeConfig(), None  # what the sentence splitter reads: decode.split_by, src_lang
        self.directory = None  # no run: no word priors, the translation's alignment places tags

    def translate_nbest(self, texts: Sequence[str], decoding: Decoding, *, splitter: object = None) -> list[list[Translation]]:
        self.texts += texts
        return [[stub_translation(text)] for text in texts]
