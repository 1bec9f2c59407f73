"""benchmarks/tagged_set.py: which spans have a counterpart, and the set its smoke
mode builds (the tag benchmark that reads it runs in tests/system/test_benchmarks.py)."""

from __future__ import annotations

import argparse
import html
import random
import re
from pathlib import Path

from benchmarks.common import smoke_corpus
from benchmarks.tagged_set import TOKEN, build, counterpart, draw_tags, side_path


def test_a_counterpart_is_contiguous_and_consistent() -> None:
    links = {(0, 0), (1, 2), (2, 1), (3, 3), (3, 5)}
    assert counterpart(links, 1, 3) == (1, 3)  # crossing inside the span is fine
    assert counterpart(links, 1, 2) == (2, 3)
    assert counterpart(links, 3, 4) is None  # 3 and 5: not contiguous
    assert counterpart(links, 4, 5) is None  # unaligned
    assert counterpart({(0, 0), (1, 0)}, 0, 1) is None  # target 0 also aligns to source 1, outside


def test_tags_are_drawn_from_the_seed_over_words_with_a_counterpart() -> None:
    source, reference = "Ein Mann, der läuft.", "A man who runs."
    links = {(0, 0), (1, 1), (3, 2), (4, 3), (4, 4), (5, 4)}  # "läuft" -> "runs .", whose "." is also the source's
    draws = [draw_tags(random.Random(seed), source, reference, links, 1) for seed in range(20)]
    assert draws[3] == draw_tags(random.Random(3), source, reference, links, 1)
    for tags in draws:
        assert 1 <= len(tags) <= 2 and len({tag.name for tag in tags}) == len(tags)
        for tag in tags:
            words = source[tag.source[0] : tag.source[1]]
            assert re.fullmatch(r"\w+( \w+){0,2}", words), words  # whole words, no punctuation
            assert words in ("Ein", "Mann", "Ein Mann", "der")  # "läuft"'s counterpart aligns to "." too
    assert any(len(tags) == 2 for tags in draws)


def test_smoke_set_has_the_tags_on_both_sides(tmp_path: Path) -> None:
    output = tmp_path / "set.json"
    report = build(argparse.Namespace(data=smoke_corpus(tmp_path), seed=1, output=output, smoke=True))
    assert report["sentences"] == 10 and report["tagged_sentences"] >= 5
    documents = {side: side_path(output, side).read_text(encoding="utf-8") for side in ("source", "reference")}
    for side, document in documents.items():
        lines = re.findall(r"^<p>(.*)</p>$", document, flags=re.MULTILINE)
        assert len(lines) == 10
        for line, row in zip(lines, report["rows"], strict=True):
            assert html.unescape(re.sub(r"<[^>]+>", "", line)) == row[side]
            for tag in row["tags"]:
                start, end = tag[side]
                assert f"{tag['open']}{html.escape(row[side][start:end], quote=False)}{tag['close']}" in line
                bounds = {edge for match in TOKEN.finditer(row[side]) for edge in match.span()}
                assert start in bounds and end in bounds and start < end
            spans = sorted(tag[side] for tag in row["tags"])
            assert all(first[1] <= second[0] for first, second in zip(spans, spans[1:], strict=False))
