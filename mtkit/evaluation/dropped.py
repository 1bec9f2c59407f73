"""The dropped-sentence flag of `mtkit evaluate -m`: a sentence of the source that the output's words leave out.

A model trained on single sentences, given a paragraph whole, often translates its first sentences and stops
(NLLB-200's known failure). The output's word alignments (cross-attention, as `--alignments` gives them) show it:
each output word points to a source word, and a sentence few of whose words are pointed to got no translation.
Few, not none: the words of a short translation attend to the sentences it left out too, now and then
(`ALIGNED_SHARE`; docs/documents.md measures the rule). Only the model that translated can say so, so the flag
needs `-m`; an output that is empty is flagged `empty`.
"""

from __future__ import annotations

from collections.abc import Sequence

from mtkit.decoding.alignment import word_indices
from mtkit.decoding.line_parts import LineParts
from mtkit.decoding.translator import Translation, Translator
from mtkit.textio import model_text

# A sentence fewer of whose words than this share an output word aligns to is dropped. On Multi30k test2016 joined
# into paragraphs, the demo model's whole-paragraph outputs that lost a sentence were flagged 208 times of 283 at 0.3
# (53 with "no word"), and no paragraph translated sentence by sentence was; at 0.4, 4 of those were.
ALIGNED_SHARE = 0.3


def dropped_sentences(words: Sequence[int], alignment: Sequence[tuple[int, int]], *, first_word: int = 0) -> list[int]:
    """The sentences (0-based) of a source fewer of whose words than `ALIGNED_SHARE` an output word aligns to.

    words: each sentence's number of source words, one sentence after another from source word `first_word` (1 where
    the source starts with a language tag, which --alignments numbers as a word); alignment: (source word, target word).
    """
    aligned = {source for source, _ in alignment}
    found, start = [], first_word
    for sentence, count in enumerate(words):
        if count and len(aligned.intersection(range(start, start + count))) < ALIGNED_SHARE * count:
            found.append(sentence)
        start += count
    return found


def sentence_words(translator: Translator, parts: LineParts) -> list[int]:
    """Each sentence's words as --alignments numbers them: a word starts at each SentencePiece piece with a word-start
    mark (so a sentence of a script written without spaces is counted as the model reads it alone)."""
    tokenizer, normalize = translator.tokenizers.src, translator.normalize
    pieces = [tokenizer.id_to_piece(tokenizer.encode(model_text(sentence, normalize))) for sentence in parts.parts]
    return [len(set(word_indices(found))) for found in pieces]


def dropped_lines(
    translator: Translator, sentences: Sequence[LineParts], *, best: Sequence[Translation], tagged: bool
) -> list[bool]:
    """Per line (cut into `sentences`), whether its best translation, which has text and alignments, leaves out a
    sentence; `tagged`: each source starts with a language tag."""
    return [
        bool(translation.text.strip())
        and translation.alignment is not None
        and bool(dropped_sentences(sentence_words(translator, parts), translation.alignment, first_word=int(tagged)))
        for parts, translation in zip(sentences, best, strict=True)
    ]
