"""Inline tags placed by eflomal: each block aligned with its translation token by token, guided by the priors of
the run's training corpus (RUN/word_priors.txt, built by `mtkit priors RUN`).

A model's cross-attention says which source words a step read, not which words translate which; an aligner
learns the latter from a corpus. A few sentences alone teach eflomal little, so it starts from the corpus's
priors (`data.word_alignment.corpus_priors`). Without the file, or without eflomal, tags are placed by the
model's attention as before (`tags.place_spans`).

The file is read once per process (its size bounded first) and kept by word; each call hands eflomal only the
lines of the words it aligns, so a call costs what its sentences cost, not what the corpus did.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mtkit.data.word_alignment import eflomal_links, symmetrized
from mtkit.documents.tags import tokens
from mtkit.errors import MtkitError
from mtkit.run_files import RunFiles
from mtkit.textio import loaded_while_unchanged, read_bounded_text, write_file

MOST_BYTES = 1 << 30  # the largest priors file read: bounds what a file makes us hold
HEADER = "# mtkit word priors "  # the file's first line: then how the priors were built, as JSON
NULL = "<NULL>"  # eflomal's empty word, whose lines every call keeps
_REBUILD = "build it again with `mtkit priors RUN`"


@dataclass(frozen=True, kw_only=True)
class TagAligner:
    """eflomal's priors by word: lexical lines by source word (with their target word), fertility lines by word,
    and the jump lines every call keeps."""

    lexical: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # source word -> (target word, line)
    fertility: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (FERF or FERR, word) -> lines
    jumps: list[str] = field(default_factory=list)  # HMMF and HMMR lines
    info: dict = field(default_factory=dict)

    @classmethod
    def read(cls, text: str, *, path: Path) -> TagAligner:
        """The priors of a word_priors.txt file's `text`; a line that is not eflomal's is one error naming it."""
        lines = text.splitlines()
        info = json.loads(lines[0][len(HEADER) :]) if lines and lines[0].startswith(HEADER) else {}
        lexical: dict[str, list[tuple[str, str]]] = defaultdict(list)
        fertility: dict[tuple[str, str], list[str]] = defaultdict(list)
        jumps = []
        for number, line in enumerate(lines, start=1):
            fields = line.split("\t")
            if line.startswith("#"):
                continue
            if fields[0] == "LEX" and len(fields) == 4:
                lexical[fields[1]].append((fields[2], line))
            elif fields[0] in ("FERF", "FERR") and len(fields) == 4:
                fertility[fields[0], fields[1]].append(line)
            elif fields[0] in ("HMMF", "HMMR") and len(fields) == 3:
                jumps.append(line)
            else:
                raise MtkitError(f"{path}, line {number}: {line[:60]!r} is not a line of eflomal's priors; {_REBUILD}")
        return cls(lexical=dict(lexical), fertility=dict(fertility), jumps=jumps, info=info)

    def links(self, pairs: Sequence[tuple[str, str]]) -> list[list[tuple[int, int]]]:
        """Each (source, translation) pair's links, (source token, target token) of `tags.tokens`, both directions
        of eflomal joined (grow-diag-final-and)."""
        sources = [[text[start:end].lower() for start, end in tokens(text)] for text, _ in pairs]
        targets = [[text[start:end].lower() for start, end in tokens(text)] for _, text in pairs]
        found = eflomal_links(sources, targets, priors=self.priors_for(sources, targets), quick=True)
        return [sorted(symmetrized(forward, reverse)) for forward, reverse in found]

    def priors_for(self, sources: Sequence[Sequence[str]], targets: Sequence[Sequence[str]]) -> str:
        """The priors text of the words of `sources` and `targets` alone."""
        source_words, target_words = {word for s in sources for word in s}, {word for t in targets for word in t}
        out = io.StringIO()
        for word in sorted(source_words | {NULL}):
            out.writelines(line + "\n" for target, line in self.lexical.get(word, ()) if target in target_words or target == NULL)
            out.writelines(line + "\n" for line in self.fertility.get(("FERF", word), ()))
        for word in sorted(target_words):
            out.writelines(line + "\n" for line in self.fertility.get(("FERR", word), ()))
        out.writelines(line + "\n" for line in self.jumps)
        return out.getvalue()


def save_priors(path: Path, priors: str, *, info: dict) -> None:
    """RUN/word_priors.txt: the header line, then eflomal's priors, written atomically."""
    write_file(path, f"{HEADER}{json.dumps(info)}\n{priors}")


def load_priors(path: Path) -> TagAligner:
    """The priors file at `path`, its size checked before it is read; a bad file is one line naming it."""
    return TagAligner.read(read_bounded_text(path, most_bytes=MOST_BYTES, fix=_REBUILD), path=path)


def aligner_of(directory: Path | None) -> TagAligner | None:
    """The tag aligner of the model loaded from `directory` (a run or an export): its word_priors.txt, read once
    while the file is unchanged; None without the file (or without eflomal, said once on stderr)."""
    if directory is None:
        return None
    path = RunFiles.of(directory).word_priors
    if not path.is_file():
        return None
    if importlib.util.find_spec("eflomal") is None:
        _say_once(f"mtkit: {path} places tags only with the eflomal aligner (pip install 'mtkit[align]'); "
                  "the model's attention places them")  # fmt: skip
        return None
    return loaded_while_unchanged(path, load_priors)


@functools.lru_cache(maxsize=16)
def _say_once(line: str) -> None:
    print(line, file=sys.stderr)
