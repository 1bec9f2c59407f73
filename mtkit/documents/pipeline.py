"""The document pipeline: blocks of text with markup in, translated blocks out, the translator seeing plain text.

1. placeholders are masked (`placeholders`), so the model never sees or changes them;
2. each block is cut into sentences (`sentences`, with --split-by sentences) that are translated together, and
   rebuilt with the block's own spacing;
3. with markup, the translations carry word alignments and each span is put back around the target words its
   source words align to (`tags`); placeholders come back exactly, once per occurrence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translation, Translator
from mtkit.documents.blocks import Block
from mtkit.documents.placeholders import mask_placeholders, space_placeholders
from mtkit.documents.sentences import sentence_splitter
from mtkit.documents.tags import place_spans
from mtkit.options import SplitBy


def translate_texts(
    translator: Translator,
    texts: Sequence[str],
    *,
    decoding: Decoding,
    split_by: SplitBy | None = None,
    language: str | None = None,
) -> list[list[Translation]]:
    """The `decoding.nbest` translations of each text, in order; with `split_by` sentences (None: the recipe's
    decode.split_by), each text's sentences are translated (all texts' together) and joined with the text's own
    spacing. `language`: the sources' language for the sentence splitter (None: decoding.src_lang, else the
    recipe's src_lang)."""
    splitter = sentence_splitter(translator, split_by=split_by, language=language or decoding.src_lang)
    return translator.translate_nbest(texts, decoding, splitter=splitter)


def translate_blocks(
    translator: Translator, blocks: Sequence[Block], *, decoding: Decoding, split_by: SplitBy | None = None
) -> list[Block]:
    """Each block translated, its spans placed over the translation (each exactly once)."""
    masked = [mask_placeholders(block) for block in blocks]
    aligned = dataclasses.replace(decoding, alignments=True) if any(block.spans for block in masked) else decoding
    found = translate_texts(translator, [block.text for block in masked], decoding=aligned, split_by=split_by)
    return [space_placeholders(place_spans(block, best[0])) for block, best in zip(masked, found, strict=True)]
