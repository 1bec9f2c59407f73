"""Sentence ends that no punctuation marks, found by the run's own corpus (RUN/sentence_ends.tsv, built by
`mtkit priors RUN`).

A caption, a title or a chat message often ends without a full stop. Joined to the next one, it reads to a
rule-based splitter as one sentence, and a model trained on single sentences then drops part of it. Between two
words inside what the rules call one sentence, a hidden-event language model (Stolcke and Shriberg, 1996) weighs
the two readings: "the sentence ends here, and a new one starts with the next word" against "the next word goes
on this sentence". Its bigram counts come from the source side of the run's training pairs, each sentence with
its final punctuation taken off, so that it learns which words end a sentence and which start one; the
probabilities are Kneser-Ney's (absolute discounting, the lower order by how many words a word follows). Case is
kept: in German, `Ein` after a noun starts a sentence where `ein` goes on one.

A cut needs strong evidence (`EVIDENCE`) and leaves at least `SHORTEST` tokens on each side, since a false cut in a
long sentence costs more than a missed one between two short ones.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from mtkit.data.word_alignment import TOKEN
from mtkit.errors import MtkitError
from mtkit.run_files import RunFiles
from mtkit.textio import loaded_while_unchanged, read_bounded_text, write_file

START, END = "<s>", "</s>"  # never a token: TOKEN cuts "<" off
EVIDENCE = 3.0  # natural log of how much likelier the cut must be than the join (e^3, about 20 to 1)
SHORTEST = 3  # tokens a cut leaves on each side at least
DISCOUNT = 0.75  # Kneser-Ney's absolute discount
MOST_BYTES = 1 << 28  # the largest sentence-ends file read: bounds what a file makes us hold
HEADER = "# mtkit sentence ends "  # the file's first line: then how the counts were gathered, as JSON
_REBUILD = "build it again with `mtkit priors RUN`"


class SentenceEnds:
    """A hidden-event bigram model of where sentences end: `cuts(sentence)` says where new ones start inside it."""

    def __init__(self, pairs: Counter[tuple[str, str]], *, info: dict | None = None) -> None:
        self.pairs = pairs  # (word, next word) -> how often, START and END included
        self.info = info or {}
        self.seen = Counter[str]()  # word -> bigrams it starts
        self.followers = Counter[str]()  # word -> distinct words after it
        self.preceders = Counter[str]()  # word -> distinct words before it
        for (first, second), count in pairs.items():
            self.seen[first] += count
            self.followers[first] += 1
            self.preceders[second] += 1
        self.kinds = len(pairs)

    @classmethod
    def learn(cls, sentences: Iterable[str], *, info: dict | None = None) -> SentenceEnds:
        """The model of `sentences` (one a string), each read without its final punctuation."""
        pairs = Counter[tuple[str, str]]()
        for sentence in sentences:
            words = [START, *_unpunctuated(TOKEN.findall(sentence)), END]
            pairs.update(itertools.pairwise(words))
        return cls(pairs, info=info)

    def probability(self, word: str, after: str) -> float:
        """P(`word` | `after`), smoothed: a pair never seen keeps a share of how widely `word` is seen."""
        widely = (self.preceders[word] + 0.5) / (self.kinds + 0.5 * (len(self.preceders) + 1))
        total = self.seen[after]
        if total == 0:
            return widely
        return (max(self.pairs[after, word] - DISCOUNT, 0) + DISCOUNT * self.followers[after] * widely) / total

    def evidence(self, word: str, after: str) -> float:
        """log of P(a sentence ends after `after` and the next starts with `word`) over P(`word` goes on after it)."""
        ending = math.log(self.probability(END, after)) + math.log(self.probability(word, START))
        return ending - math.log(self.probability(word, after))

    def cuts(self, sentence: str) -> list[int]:
        """Offsets in `sentence` where a new sentence starts unmarked: a word after a word and white space."""
        found = [(match.start(), match.end(), match.group()) for match in TOKEN.finditer(sentence)]
        cuts, last = [], 0
        for index in range(SHORTEST, len(found) - SHORTEST + 1):
            (_, end, before), (start, _, word) = found[index - 1], found[index]
            if index - last < SHORTEST or not _is_word(before) or not sentence[end:start].isspace():
                continue
            if self.evidence(word, before) > EVIDENCE:
                cuts.append(start)
                last = index
        return cuts

    def text(self) -> str:
        """The file's text: the header, then a line a pair, `word TAB next word TAB count`."""
        lines = [f"{HEADER}{json.dumps(self.info)}"]
        lines += [f"{first}\t{second}\t{count}" for (first, second), count in sorted(self.pairs.items())]
        return "\n".join(lines) + "\n"

    @classmethod
    def read(cls, text: str, *, path: Path) -> SentenceEnds:
        """The model of a sentence_ends.tsv file's `text`; a line that is not a pair's is one error naming it."""
        lines = text.splitlines()
        info = json.loads(lines[0][len(HEADER) :]) if lines and lines[0].startswith(HEADER) else {}
        pairs = Counter[tuple[str, str]]()
        for number, line in enumerate(lines, start=1):
            if line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 3 or not fields[2].isdigit():
                raise MtkitError(f"{path}, line {number}: {line[:60]!r} is not 'word TAB next word TAB count'; {_REBUILD}")
            pairs[fields[0], fields[1]] = int(fields[2])
        return cls(pairs, info=info)


def _unpunctuated(words: list[str]) -> list[str]:
    """`words` without the punctuation at their end (a sentence's full stop, closing quote, ...)."""
    end = len(words)
    while end and not _is_word(words[end - 1]):
        end -= 1
    return words[:end]


def _is_word(token: str) -> bool:
    return token[0].isalnum() or token[0] == "_"


def save_sentence_ends(path: Path, ends: SentenceEnds) -> None:
    """RUN/sentence_ends.tsv, written atomically."""
    write_file(path, ends.text())


def load_sentence_ends(path: Path) -> SentenceEnds:
    """The sentence-ends file at `path`, its size checked before it is read; a bad file is one line naming it."""
    return SentenceEnds.read(read_bounded_text(path, most_bytes=MOST_BYTES, fix=_REBUILD), path=path)


def sentence_ends_of(directory: Path | None) -> SentenceEnds | None:
    """The sentence ends of the model loaded from `directory` (a run or an export), read once while the file is
    unchanged; None without the file."""
    if directory is None:
        return None
    path = RunFiles.of(directory).sentence_ends
    if not path.is_file():
        return None
    return loaded_while_unchanged(path, load_sentence_ends)
