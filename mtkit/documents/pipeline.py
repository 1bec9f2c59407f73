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
from dataclasses import dataclass

from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translation, Translator
from mtkit.documents.blocks import Block
from mtkit.documents.formats import Document, DocumentLimits, check_size, format_named, read_document
from mtkit.documents.placeholders import mask_placeholders, space_placeholders
from mtkit.documents.tags import place_spans, plain
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
    found = translate_texts(translator, [block.text for block in masked], decoding=aligned(decoding, masked), split_by=split_by)
    return placed(masked, found)


def aligned(decoding: Decoding, masked: Sequence[Block]) -> Decoding:
    """`decoding`, with word alignments when a block has spans to place."""
    return dataclasses.replace(decoding, alignments=True) if any(block.spans for block in masked) else decoding


def placed(masked: Sequence[Block], found: Sequence[Sequence[Translation]]) -> list[Block]:
    """Each block's spans placed over its best translation."""
    return [space_placeholders(place_spans(block, best[0])) for block, best in zip(masked, found, strict=True)]


@dataclass(frozen=True, kw_only=True)
class TranslatedDocument:
    markup: str  # the document in its format, translated
    text: str  # its blocks' translations alone, the markup left out (what a metric scores)


@dataclass(frozen=True, kw_only=True)
class DocumentBatch:
    """Documents of one format read for one translation call (a server request, an evaluation's lines): their
    blocks' texts, placeholders masked, go to the translator together, and each document is written back."""

    documents: tuple[Document, ...]
    masked: tuple[Block, ...]

    @classmethod
    def read(cls, sources: Sequence[str], *, document_format: str, names: Sequence[str], limits: DocumentLimits) -> DocumentBatch:
        """Each source read in `document_format` (an error names the source by its name in `names`)."""
        row = format_named(document_format)
        documents = []
        for source, name in zip(sources, names, strict=True):
            check_size(len(source.encode("utf-8", errors="replace")), name=name, limits=limits)
            documents.append(read_document(row, source, name=name, limits=limits))
        masked = tuple(mask_placeholders(block) for document in documents for block in document.blocks)
        return cls(documents=tuple(documents), masked=masked)

    @property
    def texts(self) -> list[str]:
        return [block.text for block in self.masked]

    def written(self, found: Sequence[Sequence[Translation]]) -> list[TranslatedDocument]:
        """Each document with `found`, the translations of `texts` in order, in place of its blocks."""
        blocks, out, start = placed(self.masked, found), [], 0
        for document in self.documents:
            mine = blocks[start : start + len(document.blocks)]
            out.append(TranslatedDocument(markup=document.render(mine), text=" ".join(map(plain, mine))))
            start += len(document.blocks)
        return out


def translate_documents(
    translator: Translator,
    sources: Sequence[str],
    *,
    document_format: str,
    decoding: Decoding,
    split_by: SplitBy = SplitBy.SENTENCES,
    limits: DocumentLimits,
) -> list[TranslatedDocument]:
    """Each source, a document in `document_format`, translated (all their blocks together) and written back."""
    names = [f"document {number}" for number in range(1, len(sources) + 1)]
    batch = DocumentBatch.read(sources, document_format=document_format, names=names, limits=limits)
    found = translate_texts(translator, batch.texts, decoding=aligned(decoding, batch.masked), split_by=split_by)
    return batch.written(found)


def plain_texts(sources: Sequence[str], *, document_format: str, names: Sequence[str], limits: DocumentLimits) -> list[str]:
    """Each source, a document in `document_format`, as a metric reads it: its blocks' text, the markup left out."""
    batch = DocumentBatch.read(sources, document_format=document_format, names=names, limits=limits)
    return [" ".join(plain(block) for block in document.blocks) for document in batch.documents]
