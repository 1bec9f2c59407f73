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
from mtkit.documents.tags import place_spans
from mtkit.options import SplitBy


def translate_texts(
    translator: Translator, texts: Sequence[str], *, decoding: Decoding, split_by: SplitBy = SplitBy.SENTENCES
) -> list[list[Translation]]:
    """The `decoding.nbest` translations of each text, in order; with `split_by` sentences, each text's sentences are
    translated (all texts' together) and joined with the text's own spacing."""
    return translator.translate_nbest(texts, decoding)


def translate_blocks(
    translator: Translator, blocks: Sequence[Block], *, decoding: Decoding, split_by: SplitBy = SplitBy.SENTENCES
) -> list[Block]:
    """Each block translated, its spans placed over the translation (each exactly once)."""
    masked = [mask_placeholders(block) for block in blocks]
    aligned = dataclasses.replace(decoding, alignments=True) if any(block.spans for block in masked) else decoding
    found = translate_texts(translator, [block.text for block in masked], decoding=aligned, split_by=split_by)
    return [space_placeholders(place_spans(block, best[0])) for block, best in zip(masked, found, strict=True)]
