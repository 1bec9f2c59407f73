"""Paragraphs cut into sentences in front of every model (`--split-by sentences`), by the source language's rules.

Models trained on single sentences, imported NLLB-200 ones included, drop sentences of a paragraph given whole;
each sentence translated alone, and the paragraph rebuilt with its own spacing, keeps them. The rules are
sentencex's (Wikimedia's splitter, about 300 languages, each falling back to a related language's rules, and
English's at the end), which needs no model; wtpsplit's SaT needs one from the Hugging Face Hub. Where the run
has learnt where its corpus's sentences end (RUN/sentence_ends.tsv, `mtkit priors RUN`), a sentence the rules
found is also cut where a sentence ends without punctuation (`sentence_ends.SentenceEnds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sentencex

from mtkit.data.language_codes import ISO_639_3
from mtkit.decoding.line_parts import LineParts
from mtkit.decoding.translator import Translator
from mtkit.documents.sentence_ends import SentenceEnds, sentence_ends_of
from mtkit.options import SplitBy

ISO_639_1 = {three: two for two, three in ISO_639_3.items()}  # deu -> de: sentencex names languages by ISO 639-1


@dataclass(frozen=True)
class SentenceSplitter:
    """Cuts a line into its sentences by `language`'s rules (a `decoding.line_parts.Splitter`)."""

    language: str  # sentencex's name of the source language (de, en, ...)
    ends: SentenceEnds | None = field(default=None, compare=False)  # the run's unpunctuated sentence ends

    def cut(self, line: str) -> LineParts:
        return split_sentences(line, self.language, ends=self.ends)


def split_sentences(text: str, language: str, *, ends: SentenceEnds | None = None) -> LineParts:
    """`text`'s sentences, stripped, and the exact whitespace around each (`LineParts.text()` gives `text` back).

    sentencex only says where sentences end, and `ends` where else one ends unmarked; the text is cut here, so
    nothing but whitespace is ever moved out of a sentence and nothing is lost.
    """
    found = sentencex.get_sentence_boundaries(language, _readable(text))
    marked = sorted({boundary["end_index"] for boundary in found if 0 < boundary["end_index"] < len(text)})
    cuts = sorted({*marked, *_unmarked(text, marked, ends)})
    return _cut(text, cuts)


def _unmarked(text: str, marked: list[int], ends: SentenceEnds | None) -> list[int]:
    """Where, inside the sentences the rules found, `ends` says a new sentence starts."""
    if ends is None:
        return []
    spans = zip([0, *marked], [*marked, len(text)], strict=True)
    return [start + cut for start, end in spans for cut in ends.cuts(text[start:end])]


def _cut(text: str, offsets: list[int]) -> LineParts:
    """`text` cut at `offsets`, each piece stripped, its whitespace kept beside it."""
    parts: list[str] = []
    spaces = [""]
    for start, end in zip([0, *offsets], [*offsets, len(text)], strict=True):
        piece = text[start:end]
        sentence = piece.strip()
        if not sentence:  # whitespace alone: spacing, not a sentence
            spaces[-1] += piece
            continue
        lead = piece[: len(piece) - len(piece.lstrip())]
        spaces[-1] += lead
        parts.append(sentence)
        spaces.append(piece[len(lead) + len(sentence) :])
    return LineParts(tuple(parts), tuple(spaces))


def _readable(text: str) -> str:
    """`text` as sentencex reads it safely, each character in its place: a lone surrogate as "?", and a space outside
    ASCII (a no-break space) as " " (sentencex 1.0.32 panics cutting inside one before a full stop: "Z\u00a0.")."""
    plain = "".join(" " if character.isspace() and not character.isascii() else character for character in text)
    return plain.encode("utf-8", errors="replace").decode("utf-8")


def splitter_language(name: str) -> str:
    """sentencex's name of a language given as mtkit names one: `de`, `de-DE`, or an NLLB-200 code (`deu_Latn`)."""
    language = name.replace("-", "_").split("_")[0].lower()
    return ISO_639_1.get(language, language)


def sentence_splitter(translator: Translator, *, split_by: SplitBy | str | None, language: str | None) -> SentenceSplitter | None:
    """The splitter a front end gives the translator: None with `lines`; `split_by` None is the recipe's
    decode.split_by. `language`: the source's (--src-lang), else the recipe's src_lang (English's rules without one)."""
    chosen = SplitBy(split_by if split_by is not None else translator.decode.split_by)
    return None if chosen is SplitBy.LINES else source_splitter(translator, language=language)


def source_splitter(translator: Translator, *, language: str | None) -> SentenceSplitter:
    """The splitter of the sources' language: `language` (--src-lang), else the recipe's src_lang, else English; with
    the sentence ends of the model's run or export when it has them."""
    config = translator.config
    language = splitter_language(language or (config.src_lang if config is not None else "en"))
    return SentenceSplitter(language, ends=sentence_ends_of(translator.directory))
