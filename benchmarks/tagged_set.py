"""The tagged test set of the tag benchmark (benchmarks/tags.py): Multi30k test2016 (German -> English) with inline tags.

    python -m benchmarks.tagged_set [--data ../shared/data/multi30k] [--seed 1]
        [--output benchmarks/results/tagged_set.json] [--smoke]

1. Word alignments of each source and its reference, from eflomal run on the whole training corpus and the test set
   (alignment learns from every pair), both directions joined by grow-diag-final-and; words are `TOKEN` matches,
   punctuation apart.
2. For each sentence, one or two tags (<b>, <i>, <a href="...">, distinct) around source spans of 1-3 words drawn
   with the seed, among the spans whose aligned reference words are contiguous and align to nothing outside the
   span (a span without such a counterpart is never drawn; a sentence with none gets no tag). The reference gets
   the same tags over those words. Tags do not overlap.
3. Written beside the JSON: NAME.source.html and NAME.reference.html, an HTML document each with one <p> a
   sentence on a line of its own; the JSON holds each sentence's text and tags (character offsets into the plain
   text, both sides).

The span draw is seeded; eflomal seeds its samplers from the system, so alignments (and with them which spans
qualify) can differ slightly from one build to the next: the files built are the set. `--smoke`: the tests' slice
(1,000 training pairs, 10 test sentences).
"""

from __future__ import annotations

import argparse
import datetime
import html
import importlib.metadata
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import common
from mtkit.data import word_alignment
from mtkit.textio import file_lines, write_file

TOKEN = word_alignment.TOKEN  # a word or one punctuation mark: the tokenisation of alignment and scoring
WORD = re.compile(r"\w+")
TAG_NAMES = ("b", "i", "a")
MAX_SPAN = 3
Links = word_alignment.Links


@dataclass(frozen=True, kw_only=True)
class Tag:
    name: str
    open: str
    close: str
    source: tuple[int, int]  # character offsets into the plain source
    reference: tuple[int, int]  # and into the plain reference


def read(path: Path) -> list[str]:
    return [text for _, text in file_lines(path)]


def token_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) character offsets of each token of `text`."""
    return [match.span() for match in TOKEN.finditer(text)]


def eflomal_links(sources: list[str], targets: list[str], *, last: int, quick: bool = False) -> list[Links]:
    """The token alignments (source token, target token) of the `last` pairs, eflomal having aligned all of them
    (it learns from every pair), its two directions joined (`quick`: one sampler and fewer iterations, for the smoke
    mode)."""
    found = word_alignment.eflomal_links([TOKEN.findall(t) for t in sources], [TOKEN.findall(t) for t in targets], quick=quick)
    return [word_alignment.symmetrized(forward, reverse) for forward, reverse in found[len(sources) - last :]]


def counterpart(links: Links, start: int, end: int) -> tuple[int, int] | None:
    """The target tokens [lo, hi) source tokens [start, end) align to, when they are contiguous and align to
    nothing outside the span; else None."""
    targets = sorted({j for i, j in links if start <= i < end})
    if not targets or targets[-1] - targets[0] + 1 != len(targets):
        return None
    lo, hi = targets[0], targets[-1] + 1
    if any(lo <= j < hi and not start <= i < end for i, j in links):
        return None
    return lo, hi


def draw_tags(rng: random.Random, source: str, reference: str, links: Links, number: int) -> list[Tag]:
    """One or two distinct tags over source spans of 1-3 words that have a counterpart, apart on both sides."""
    source_tokens, reference_tokens = token_spans(source), token_spans(reference)
    words = [WORD.fullmatch(source[a:b]) is not None for a, b in source_tokens]
    candidates = [
        (start, start + size, found)
        for size in range(1, MAX_SPAN + 1)
        for start in range(len(source_tokens) - size + 1)
        if all(words[start : start + size]) and (found := counterpart(links, start, start + size)) is not None
    ]
    rng.shuffle(candidates)
    names = rng.sample(TAG_NAMES, rng.choice((1, 2)))
    taken: list[tuple[int, int, tuple[int, int]]] = []
    for start, end, (lo, hi) in candidates:
        if len(taken) == len(names):
            break
        if all(end <= s or e <= start for s, e, _ in taken) and all(hi <= lo2 or hi2 <= lo for _, _, (lo2, hi2) in taken):
            taken.append((start, end, (lo, hi)))
    return [
        Tag(
            name=name,
            open=f'<a href="https://example.com/{number}">' if name == "a" else f"<{name}>",
            close=f"</{name}>",
            source=(source_tokens[start][0], source_tokens[end - 1][1]),
            reference=(reference_tokens[lo][0], reference_tokens[hi - 1][1]),
        )
        for name, (start, end, (lo, hi)) in zip(names, taken, strict=False)
    ]


def tagged_line(text: str, tags: list[tuple[str, str, tuple[int, int]]]) -> str:
    """`text` escaped for HTML with each (open, close, (start, end)) around its characters (apart, any order)."""
    pieces, done = [], 0
    for open_, close, (start, end) in sorted(tags, key=lambda tag: tag[2]):
        pieces += [html.escape(text[done:start], quote=False), open_, html.escape(text[start:end], quote=False), close]
        done = end
    return "".join(pieces) + html.escape(text[done:], quote=False)


def html_document(lines: list[str], title: str) -> str:
    body = "".join(f"<p>{line}</p>\n" for line in lines)
    head = f'<!DOCTYPE html>\n<html>\n<head><meta charset="utf-8"><title>{title}</title></head>\n<body>\n'
    return head + body + "</body>\n</html>\n"


def build(args: argparse.Namespace) -> dict:
    """The set: alignments, drawn tags, the two HTML documents written beside `args.output`; its JSON returned."""
    sources, references = read(args.data / "test_2016_flickr.de.gz"), read(args.data / "test_2016_flickr.en.gz")
    train_sources, train_targets = read(args.data / "train.de.gz"), read(args.data / "train.en.gz")
    links = eflomal_links(train_sources + sources, train_targets + references, last=len(sources), quick=args.smoke)
    rng = random.Random(args.seed)
    rows = []
    for number, (source, reference, pair) in enumerate(zip(sources, references, links, strict=True), start=1):
        tags = draw_tags(rng, source, reference, pair, number)
        rows.append({"source": source, "reference": reference, "tags": [asdict(tag) for tag in tags]})
    args.output.parent.mkdir(parents=True, exist_ok=True)
    for side in ("source", "reference"):
        lines = [tagged_line(row[side], [(t["open"], t["close"], t[side]) for t in row["tags"]]) for row in rows]
        write_file(side_path(args.output, side), html_document(lines, f"Multi30k test2016, tagged ({side})"))
    tags = [tag["name"] for row in rows for tag in row["tags"]]
    return {
        **common.smoke_label(args),
        "date": datetime.date.today().isoformat(),
        "data": str(args.data),
        "seed": args.seed,
        "aligner": {
            "tool": f"eflomal {importlib.metadata.version('eflomal')}",
            "pairs": len(train_sources) + len(sources),
            "symmetrization": "grow-diag-final-and",
            "tokens": TOKEN.pattern,
        },
        "sentences": len(rows),
        "tagged_sentences": sum(bool(row["tags"]) for row in rows),
        "tags": {name: tags.count(name) for name in TAG_NAMES},
        "rows": rows,
    }


def side_path(output: Path, side: str) -> Path:
    """NAME.source.html or NAME.reference.html beside the set's NAME.json."""
    return output.with_name(f"{output.stem}.{side}.html")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/multi30k"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/tagged_set.json"))
    common.add_smoke_options(parser)
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the first lines of the tests' slice (1,000 training pairs, 10 test sentences)."""
    args.data = common.smoke_corpus(work)


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, build, args.output)
    print(f"{report['sentences']} sentences, {report['tagged_sentences']} tagged; tags {report['tags']}")
    print(f"written to {args.output}, {side_path(args.output, 'source')} and {side_path(args.output, 'reference')}")


if __name__ == "__main__":
    main()
