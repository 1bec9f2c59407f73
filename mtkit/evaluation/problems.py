"""Where a system breaks: per-sentence problem flags for `mtkit evaluate`'s report and `--flags FILE`.

- `loop`: a word n-gram repeated in the output (`loop_ngram` words, at least `loop_count` times), or
  a run of one character sequence repeated within a word ("assembembembembled");
- `copy`: the output copies the source (most of its words are source words);
- `empty`: an empty output for a non-empty source;
- `too_long` / `too_short`: the output's length in characters, divided by its source's (or, without
  sources, its reference's), is more than `length_band` times the corpus's own ratio (references
  over sources; without references, the outputs' own over the sources), or less than that ratio
  divided by `length_band`: runaway or truncated output;
- `dropped` (with `-m` only: it reads the model's word alignments, `mtkit.evaluation.dropped`): a sentence
  of the source that no word of a non-empty output aligns to.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from mtkit.errors import OptionError
from mtkit.textio import atomic_output

TEXT_FLAGS = ("loop", "copy", "empty", "too_long", "too_short")  # read from the texts alone
DROPPED = "dropped"
FLAGS = (*TEXT_FLAGS, DROPPED)
_WORD = re.compile(r"\w+", re.UNICODE)
_STUTTER = re.compile(r"(\w{2,}?)\1{3,}", re.UNICODE)  # a unit of 2+ word characters, 4+ times in a row


@dataclass(frozen=True, kw_only=True)
class FlagRules:
    """The thresholds (options of `mtkit evaluate`)."""

    loop_ngram: int = 2
    loop_count: int = 3
    copy_ratio: float = 0.8  # share of output words found in the source
    copy_min_words: int = 3
    length_band: float = 2.0


def parse_rules(items: Sequence[str]) -> FlagRules:
    """`--flag-rule KEY=VALUE` options over the defaults, each checked."""
    rules = FlagRules()
    for item in items:
        key, _, value = item.partition("=")
        if key not in {f.name for f in fields(FlagRules)}:
            names = ", ".join(f.name for f in fields(FlagRules))
            raise OptionError(
                "flag_rule",
                "{flag_rule} {item}: unknown threshold {key!r}; give KEY=VALUE with KEY one of {names}",
                item=item,
                key=key,
                names=names,
            )
        kind = type(getattr(rules, key))
        try:
            number = kind(value)
        except ValueError:
            raise OptionError(
                "flag_rule",
                "{flag_rule} {item}: {value!r} is not a number ({kind}), e.g. {key}={default}",
                item=item,
                value=value,
                kind=kind.__name__,
                key=key,
                default=getattr(rules, key),
            ) from None
        if number <= 0:
            raise OptionError(
                "flag_rule",
                "{flag_rule} {item}: give a number > 0, e.g. {key}={default}",
                item=item,
                key=key,
                default=getattr(rules, key),
            )
        rules = replace(rules, **{key: number})
    return rules


def sentence_flags(hypothesis: str, source: str | None, *, expected_ratio: float, length_of: str, rules: FlagRules) -> list[str]:
    """The flags of one output; `length_of` is the source (or the reference) its length is compared with."""
    flags = []
    words = hypothesis.lower().split()
    if _loops(words, rules) or _STUTTER.search(hypothesis):
        flags.append("loop")
    if source is not None and _copies(words, source, rules):
        flags.append("copy")
    if not hypothesis.strip():
        flags.append("empty" if length_of.strip() else "")
    elif length_of.strip():
        ratio = len(hypothesis) / len(length_of)
        if ratio > expected_ratio * rules.length_band:
            flags.append("too_long")
        elif ratio < expected_ratio / rules.length_band:
            flags.append("too_short")
    return [flag for flag in flags if flag]


def flag_corpus(
    hypotheses: Sequence[str], references: Sequence[str] | None, *, sources: Sequence[str] | None, rules: FlagRules
) -> list[list[str]]:
    """Each output's flags; lengths are compared with the sources when given, else the references (one of
    them is given)."""
    bases = sources if sources is not None else references
    assert bases is not None, "flags need the sources or the references"
    targets = references if references is not None else hypotheses
    expected = sum(map(len, targets)) / max(sum(map(len, bases)), 1)  # the corpus's own length ratio
    return [
        sentence_flags(
            hypothesis, sources[n] if sources is not None else None, expected_ratio=expected, length_of=bases[n], rules=rules
        )
        for n, hypothesis in enumerate(hypotheses)
    ]


def flag_counts(flags: Sequence[Sequence[str]], *, names: Sequence[str] = TEXT_FLAGS) -> dict[str, int]:
    """How many outputs have each flag of `names` (those known: `dropped` needs the model)."""
    counted = Counter(flag for sentence in flags for flag in sentence)
    return {flag: counted[flag] for flag in names}


def write_flags(
    path: Path,
    names: Sequence[str],
    *,
    flags: Sequence[Sequence[Sequence[str]]],
    sources: Sequence[str] | None,
    hypotheses: Sequence[Sequence[str]],
    references: Sequence[str] | None,
) -> int:
    """A TSV (line, flags, source, hypothesis, reference; first `system` when there are several) of
    every flagged sentence of every system, worst (most flags) first; returns the number of rows."""

    rows = [(system, n) for system, found in enumerate(flags) for n, sentence in enumerate(found) if sentence]
    rows.sort(key=lambda row: (-len(flags[row[0]][row[1]]), row[1], row[0]))
    several = len(names) > 1
    with atomic_output(path) as out:
        out.write(("system\t" if several else "") + "line\tflags\tsource\thypothesis\treference\n")
        for system, n in rows:
            source = sources[n] if sources is not None else ""
            reference = references[n] if references is not None else ""
            fields = [str(n + 1), ",".join(flags[system][n]), source, hypotheses[system][n], reference]
            fields = [names[system], *fields] if several else fields
            out.write("\t".join(field.replace("\t", " ") for field in fields) + "\n")
    return len(rows)


def _loops(words: list[str], rules: FlagRules) -> bool:
    ngrams = Counter(tuple(words[i : i + rules.loop_ngram]) for i in range(len(words) - rules.loop_ngram + 1))
    return bool(ngrams) and max(ngrams.values()) >= rules.loop_count


def _copies(words: list[str], source: str, rules: FlagRules) -> bool:
    tokens = [word for word in _WORD.findall(" ".join(words))]
    if len(tokens) < rules.copy_min_words:
        return False
    source_words = set(_WORD.findall(source.lower()))
    return sum(token in source_words for token in tokens) >= rules.copy_ratio * len(tokens)
