"""Property-based tests: hostile text in (any Unicode, control characters, NUL, BOM, CRLF, lone
surrogates, very long lines) never crashes mtkit, and `translate` keeps one line per input line."""

from __future__ import annotations

import math
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.config import DataConfig, SplitConfig
from mtkit.data import clean_pairs, read_split
from mtkit.errors import MtkitError
from mtkit.evaluate import score_corpus
from mtkit.textio import decode_lines
from mtkit.translate import Translator

# Everything Unicode has, lone surrogates included; newlines are what separate lines.
ANY_CHARACTER = st.characters(codec=None, exclude_characters="\n")
HOSTILE = st.sampled_from(["\x00", "\ufeff", "\r", "\t", "\u200f", "\u0301", "\U0001f600", "\u2028", "\x85", "\x1b[31m"])
LINE = st.lists(st.one_of(ANY_CHARACTER, HOSTILE), max_size=30).map("".join)
LINES = st.lists(LINE, min_size=0, max_size=6)
FAST = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def to_bytes(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8", errors="surrogatepass")


def has_surrogate(text: str) -> bool:
    return any(unicodedata.category(c) == "Cs" for c in text)


@FAST
@given(pairs=st.lists(st.tuples(LINE, LINE), max_size=8))
def test_reading_parallel_files_keeps_pairs_aligned_or_names_the_bad_line(tmp_path, pairs):
    src, tgt = tmp_path / "corpus.src", tmp_path / "corpus.tgt"
    src.write_bytes(to_bytes([s for s, _ in pairs]))
    tgt.write_bytes(to_bytes([t for _, t in pairs]))
    try:
        read = read_split(SplitConfig(src=str(src), tgt=str(tgt)), "de", "en", "NFC")
    except MtkitError as err:
        message = str(err)
        assert "\n" not in message
        assert "not valid UTF-8" in message and ("corpus.src:" in message or "corpus.tgt:" in message)
        assert any(has_surrogate(s) or has_surrogate(t) for s, t in pairs)
        return
    assert len(read) == len(pairs)
    for (src_text, tgt_text), (raw_src, raw_tgt) in zip(read, pairs, strict=True):
        assert "\n" not in src_text and "\n" not in tgt_text
        assert src_text == unicodedata.normalize("NFC", src_text) and tgt_text == unicodedata.normalize("NFC", tgt_text)
        assert len(src_text) <= len(unicodedata.normalize("NFC", raw_src)) and len(tgt_text) <= len(
            unicodedata.normalize("NFC", raw_tgt)
        )


@FAST
@given(pairs=st.lists(st.tuples(LINE, LINE), max_size=12), max_len=st.integers(1, 10), max_ratio=st.floats(1.0, 4.0))
def test_cleaning_accounts_for_every_pair(pairs, max_len, max_ratio):
    kept, report = clean_pairs(pairs, DataConfig(max_len=max_len, max_ratio=max_ratio))
    removed = report.empty + report.too_long + report.ratio + report.duplicate + report.copy
    assert report.total == len(pairs) and report.kept == len(kept) == report.total - removed
    assert len(set(kept)) == len(kept)
    for source, target in kept:
        words = len(source.split()), len(target.split())
        assert min(words) > 0 and max(words) <= max_len and max(words) / min(words) <= max_ratio
        assert source != target


@FAST
@given(data=st.binary(max_size=200))
def test_any_bytes_decode_to_lines_or_a_one_line_error(data):
    try:
        lines = decode_lines(data, "input.txt")
    except MtkitError as err:
        assert str(err).startswith("input.txt:") and "\n" not in str(err)
        return
    text = data.decode("utf-8").removeprefix("\ufeff")
    assert len(lines) == text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    assert all("\n" not in line for line in lines)


@pytest.fixture(scope="module")
def greedy_translator(reverse_run) -> Translator:
    translator = Translator.load(reverse_run.run_path)
    translator.decode.beam = 1
    translator.decode.max_len_b = 4
    return translator


@FAST
@given(lines=LINES)
def test_translate_returns_exactly_one_line_per_input_line(greedy_translator, lines):
    output = greedy_translator.translate(lines)
    assert len(output) == len(lines)
    for source, translation in zip(lines, output, strict=True):
        assert "\n" not in translation
        if not source.strip():
            assert translation == ""


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=120))
def test_translate_command_never_shows_a_traceback(reverse_run, data):
    result = CliRunner().invoke(app, ["translate", "-m", str(reverse_run.run_path), "--beam", "1"], input=data)
    if result.exit_code == 0:
        expected = decode_lines(data, "<stdin>")
        assert result.stdout.count("\n") == len(expected)
    else:
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
        assert result.stderr.startswith("mtkit: error: <stdin>:") and result.stderr.count("\n") == 1


@FAST
@given(rows=st.lists(st.tuples(LINE, LINE, LINE), min_size=1, max_size=6))
def test_scores_are_finite_for_any_text(rows):
    hypotheses = [h.encode("utf-8", "replace").decode() for h, _, _ in rows]
    references = [
        [r.encode("utf-8", "replace").decode() for _, r, _ in rows],
        [r.encode("utf-8", "replace").decode() for _, _, r in rows],
    ]
    result = score_corpus(hypotheses, references)
    for score in result.scores:
        assert math.isfinite(score.score) and score.score >= 0
        assert score.signature
