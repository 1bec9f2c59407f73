"""Terminology as users give it: constraint lists, `--constraints` files and `--glossary` files.

A `Term` is one constraint: a phrase, or alternative phrases any one of which satisfies it, that
the translation must contain (`mtkit.decoding.terminology.constrained` does the searching).

- `--constraints FILE`: one JSON list per input line, each item a phrase or a list of alternative
  phrases: `["Fahrrad", ["Hund", "Hunde"]]`; `[]` for none.
- `--glossary FILE.tsv`: a source term, a tab, and one or more target terms (tab-separated
  alternatives). A line of input gets the target terms of every source term it contains: matched
  without regard to case, as a whole word or words (not inside a longer word), on the text as the
  model reads it (Unicode NFC); a target term is also met with its first letter capitalised. Empty
  lines and lines starting with `#` are skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mtkit.data.tokenizer import UNK_ID, Tokenizer
from mtkit.errors import MtkitError
from mtkit.textio import file_lines, model_text

EXAMPLE = '["Fahrrad", ["Hund", "Hunde"]]'


@dataclass(frozen=True, kw_only=True)
class Term:
    """One constraint: alternative target phrases; `source` is the glossary term that asked for it."""

    alternatives: tuple[str, ...]
    source: str | None = None
    where: str = ""  # "FILE:LINE" or "line N", for errors
    optional: frozenset[str] = frozenset()  # alternatives mtkit added (capitalised): dropped where the model cannot write them

    @property
    def label(self) -> str:
        return " | ".join(self.alternatives)


def as_terms(items: Sequence[str | Sequence[str] | Term], where: str) -> list[Term]:
    """The constraints of one line, from phrases, lists of alternatives, or `Term`s; checked."""
    if isinstance(items, str):
        raise MtkitError(f"{where}: constraints are a list of phrases, such as {EXAMPLE}; got the text {items[:40]!r}")
    terms = []
    for item in items:
        if isinstance(item, Term):
            terms.append(item)
            continue
        alternatives = [item] if isinstance(item, str) else list(item)
        if not alternatives or not all(isinstance(a, str) for a in alternatives):
            raise MtkitError(f"{where}: {item!r} is not a phrase or a list of phrases; write constraints as {EXAMPLE}")
        if any(not a.strip() for a in alternatives):
            raise MtkitError(f"{where}: an empty phrase in {item!r}; every constraint needs some text, such as {EXAMPLE}")
        terms.append(Term(alternatives=tuple(a.strip() for a in alternatives), where=where))
    return terms


def parse_constraints(text: str, where: str) -> list[Term]:
    """One line of a --constraints file: a JSON list (empty for none)."""
    try:
        items = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as err:
        raise MtkitError(f"{where}: not JSON ({err.msg}); write one list per line, such as {EXAMPLE}, or [] for none") from None
    if not isinstance(items, list):
        raise MtkitError(f"{where}: {text.strip()[:40]!r} is not a list; write one list per line, such as {EXAMPLE}")
    return as_terms(items, where)


@dataclass(frozen=True)
class Glossary:
    """Source terms and their target terms; `terms_for` picks those a line needs."""

    entries: tuple[tuple[str, tuple[str, ...], str], ...]  # (source term, target terms, FILE:LINE)

    @classmethod
    def load(cls, path: Path, normalize: str = "NFC") -> Glossary:
        if not path.is_file():
            raise MtkitError(f"--glossary {path}: no such file; give a TSV file of source term TAB target term(s)")
        entries = []
        for number, line in file_lines(path):
            if not line.strip() or line.startswith("#"):
                continue
            source, *targets = (model_text(column, normalize).strip() for column in line.split("\t"))
            if not source or not targets or not all(targets):
                raise MtkitError(
                    f"{path}:{number}: {line.strip()[:40]!r}: write a source term, a tab, and one or more "
                    "tab-separated target terms, such as 'Hund<TAB>dog<TAB>dogs'"
                )
            entries.append((source, tuple(targets), f"{path}:{number}"))
        return cls(tuple(entries))

    def terms_for(self, text: str) -> list[Term]:
        """The target terms of every source term found in `text` (as the model reads it); each target
        term may also start with a capital letter (a sentence may begin with it)."""
        found = [
            Term(alternatives=targets, source=source, where=where)
            for source, targets, where in self.entries
            if contains_term(text, source)
        ]
        return [with_capitals(term) for term in found]


def with_capitals(term: Term) -> Term:
    """The term, also met with the first letter of an alternative capitalised (those added are optional)."""
    capitalised = [a[:1].upper() + a[1:] for a in term.alternatives]
    added = [a for a in dict.fromkeys(capitalised) if a not in term.alternatives]
    return Term(alternatives=(*term.alternatives, *added), source=term.source, where=term.where, optional=frozenset(added))


def contains_term(text: str, term: str) -> bool:
    """`term` occurs in `text` as whole words, in any case."""
    return re.search(rf"(?<!\w){re.escape(term)}(?!\w)", text, flags=re.IGNORECASE) is not None


def encode_term(term: Term, tokenizer: Tokenizer, *, normalize: str, most_pieces: int) -> list[list[int]]:
    """The target ids of each alternative of `term`; a phrase the model cannot write is an error."""
    phrases = []
    for text in term.alternatives:
        ids = tokenizer.encode(model_text(text, normalize))
        if text in term.optional and (not ids or UNK_ID in ids or len(ids) > most_pieces):
            continue
        if not ids:
            raise MtkitError(f"{term.where}: the phrase {text!r} has no text once normalised; give a word or words")
        if UNK_ID in ids:
            raise MtkitError(
                f"{term.where}: the model's target vocabulary cannot write {text!r} (a character it never saw "
                "comes out as <unk>); check the spelling, or leave the term out"
            )
        if len(ids) > most_pieces:
            raise MtkitError(f"{term.where}: {text[:40]!r} is {len(ids)} pieces, more than the model's {most_pieces}; shorten it")
        phrases.append(ids)
    return phrases


def word_continuations(tokenizer: Tokenizer) -> tuple[bool, ...]:
    """Per target id: the piece continues the word before it (no word-start mark, and it starts
    with a letter or digit); a phrase is met only where the next piece does not."""
    pieces = tokenizer.id_to_piece(list(range(tokenizer.vocab_size)))
    return tuple(not piece.startswith("\u2581") and piece[:1].isalnum() for piece in pieces)


def place_terms(
    segments_of_line: list[list[str]], terms_of_line: list[list[Term]], *, sentences: Sequence[bool] | None = None
) -> list[list[Term]]:
    """The terms of each segment (flat, in order): a line's terms go with its only segment; in a line cut
    into segments (its sentences, where `sentences` says so, or parts of an over-long line), each glossary term
    goes with the first segment holding its source term."""
    placed = []
    for n, (segments, terms) in enumerate(zip(segments_of_line, terms_of_line, strict=True)):
        if len(segments) <= 1 or not terms:
            placed.extend([terms] * len(segments))
            continue
        of_segment: list[list[Term]] = [[] for _ in segments]
        for term in terms:
            where = next((k for k, text in enumerate(segments) if term.source and contains_term(text, term.source)), None)
            if where is None:
                raise MtkitError(_no_place(term, len(segments), sentences=bool(sentences and sentences[n])))
            of_segment[where].append(term)
        placed.extend(of_segment)
    return placed


def _no_place(term: Term, segments: int, *, sentences: bool) -> str:
    """Why a constraint without a source term has no segment to go with, and the ways out."""
    glossary = "give the term through --glossary (each term then goes with the segment holding its source term)"
    if sentences:
        return (
            f"{term.where}: the line is translated sentence by sentence ({segments} segments, --split-by sentences), so "
            f"the constraint {term.label!r} has no place; {glossary}, or translate the line whole with --split-by lines"
        )
    return (
        f"{term.where}: the line is longer than decode.max_input_tokens and is translated in {segments} "
        f"segments, so the constraint {term.label!r} has no place; shorten the line, or {glossary}"
    )
