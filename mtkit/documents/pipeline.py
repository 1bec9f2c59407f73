"""The document pipeline: blocks of text with markup in, translated blocks out, the translator seeing plain text.

1. placeholders are masked (`placeholders`), so the model never sees or changes them;
2. each block is cut into sentences (`sentences`, with --split-by sentences) that are translated together, and
   rebuilt with the block's own spacing;
3. with markup, each span is put back around the target words its source words align to (`tags`): aligned by
   eflomal with the run's priors where it has them (`aligner`), else by the model's attention; placeholders come
   back exactly, once per occurrence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translation, Translator
from mtkit.documents.aligner import TagAligner, aligner_of
from mtkit.documents.blocks import Block
from mtkit.documents.formats import Document, DocumentLimits, check_size, format_named, read_document
from mtkit.documents.placeholders import mask_placeholders, space_placeholders
from mtkit.documents.sentences import sentence_splitter
from mtkit.documents.tags import place_spans, plain
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
    masked, aligner = [mask_placeholders(block) for block in blocks], aligner_of(translator.directory)
    decoding = aligned(decoding, masked, aligner=aligner)
    found = translate_texts(translator, [block.text for block in masked], decoding=decoding, split_by=split_by)
    return placed(masked, found, aligner=aligner)


def aligned(decoding: Decoding, masked: Sequence[Block], *, aligner: TagAligner | None) -> Decoding:
    """`decoding`, with the model's word alignments when a block has spans to place and no aligner places them."""
    if aligner is None and any(block.spans for block in masked):
        return dataclasses.replace(decoding, alignments=True)
    return decoding


def placed(masked: Sequence[Block], found: Sequence[Sequence[Translation]], *, aligner: TagAligner | None) -> list[Block]:
    """Each block's spans placed over its best translation, by `aligner`'s links (all blocks' in one call) or the
    translation's own alignment."""
    best = [translations[0] for translations in found]
    tagged = [n for n, block in enumerate(masked) if block.spans]
    links: dict[int, list[tuple[int, int]]] = {}
    if aligner is not None and tagged:
        links = dict(zip(tagged, aligner.links([(masked[n].text, best[n].text) for n in tagged]), strict=True))
    return [
        space_placeholders(place_spans(block, translation, token_links=links.get(n)))
        for n, (block, translation) in enumerate(zip(masked, best, strict=True))
    ]


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

    def written(self, found: Sequence[Sequence[Translation]], *, aligner: TagAligner | None) -> list[TranslatedDocument]:
        """Each document with `found`, the translations of `texts` in order, in place of its blocks (tags placed by
        `aligner`, else by the translations' alignments)."""
        blocks, out, start = placed(self.masked, found, aligner=aligner), [], 0
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
    split_by: SplitBy | None = None,
    limits: DocumentLimits,
    language: str | None = None,
) -> list[TranslatedDocument]:
    """Each source, a document in `document_format`, translated (all their blocks together) and written back
    (`split_by`, `language`: as `translate_texts` reads them)."""
    names = [f"document {number}" for number in range(1, len(sources) + 1)]
    batch = DocumentBatch.read(sources, document_format=document_format, names=names, limits=limits)
    aligner = aligner_of(translator.directory)
    found = translate_texts(translator, batch.texts, decoding=aligned(decoding, batch.masked, aligner=aligner), split_by=split_by,
                            language=language)  # fmt: skip
    return batch.written(found, aligner=aligner)


def plain_texts(sources: Sequence[str], *, document_format: str, names: Sequence[str], limits: DocumentLimits) -> list[str]:
    """Each source, a document in `document_format`, as a metric reads it: its blocks' text, the markup left out."""
    batch = DocumentBatch.read(sources, document_format=document_format, names=names, limits=limits)
    return [" ".join(plain(block) for block in document.blocks) for document in batch.documents]
