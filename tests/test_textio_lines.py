"""Reading lines for `translate` (textio.line_windows): a long line from a pipe is read in work that grows with its
length, not its square, and a line over the cap, from a pipe or a file, is one error naming it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mtkit import textio
from mtkit.errors import MtkitError
from mtkit.textio import line_windows


class CountedChunk(bytes):
    """A chunk of input that counts the bytes each concatenation with it, or search of it, goes through."""

    touched = 0

    def __add__(self, other: bytes) -> bytes:
        CountedChunk.touched += len(self) + len(other)
        return bytes(self) + bytes(other)

    def __radd__(self, other: bytes) -> bytes:
        CountedChunk.touched += len(other) + len(self)
        return bytes(other) + bytes(self)

    def split(self, *args: object) -> list[bytes]:
        CountedChunk.touched += len(self)
        return bytes(self).split(*args)

    def find(self, *args: object) -> int:
        CountedChunk.touched += len(self)
        return bytes(self).find(*args)


class PipeStdin:
    """A standard input that is a pipe (what `line_windows` polls); its reads are the test's chunks."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer = fd, None

    def fileno(self) -> int:
        return self.fd


class ChunkReads:
    """textio's `os`, but whose reads of the pipe give `chunks`, then the end of input."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = iter(chunks)

    def read(self, fd: int, size: int) -> bytes:
        return next(self.chunks, b"")

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


@pytest.fixture
def piped(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[list[bytes]], None]]:
    """Give standard input as a pipe from which `line_windows` reads the chunks passed."""
    read_end, write_end = os.pipe()  # nothing is written: select finds no more input waiting
    monkeypatch.setattr("sys.stdin", PipeStdin(read_end))
    CountedChunk.touched = 0
    yield lambda chunks: monkeypatch.setattr(textio, "os", ChunkReads(chunks))
    os.close(read_end)
    os.close(write_end)


def read_all(path: Path | None = None) -> list[str]:
    return [line for window in line_windows(path, 10) for line in window]


def test_a_long_line_from_a_pipe_is_read_in_linear_work(piped):
    chunk = CountedChunk(b"a" * textio.READ_BYTES)
    reads = 256  # a 16 MiB line in 64 KiB reads
    piped([chunk] * reads + [CountedChunk(b"\nnext\n")])
    assert [len(line) for line in read_all()] == [reads * len(chunk), 4]
    # each read is searched once; joined once at the end (re-scanning the line so far at every read: ~128 times more)
    assert CountedChunk.touched <= 2 * (reads * len(chunk) + 6)


def test_a_line_from_a_pipe_over_the_cap_is_one_error_before_the_rest_is_read(piped, monkeypatch):
    monkeypatch.setattr(textio, "MAX_LINE_BYTES", 1000)
    never_read = CountedChunk(b"the rest\n")
    piped([b"a" * 1000 + b"\nok\n" + b"b" * 600, b"b" * 401, never_read])
    with pytest.raises(MtkitError) as caught:
        read_all()
    assert str(caught.value) == (
        "<stdin>:3: a line of more than 1,000 bytes; split it into lines of at most that size (a sentence or a paragraph a line)"
    )
    assert CountedChunk.touched == 0  # stopped before reading on


def test_a_line_of_a_file_over_the_cap_is_one_error_naming_the_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr(textio, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "input.txt"
    path.write_bytes(b"a" * 1000 + b"\n" + b"b" * 1000 + b"\nc\n" + b"d" * 1001 + b"\ne\n")
    with pytest.raises(MtkitError, match=rf"^{path}:4: a line of more than 1,000 bytes; split it"):
        read_all(path)
    path.write_bytes(b"a" * 1000 + b"\n" + b"b" * 1000)  # at the cap, with and without a last newline
    assert read_all(path) == ["a" * 1000, "b" * 1000]


def test_lines_from_a_pipe_across_reads_come_whole_and_in_order(piped):
    piped([b"one\ntw", b"o", b"\n\nthr", b"ee\r\nfour"])
    assert read_all() == ["one", "two", "", "three", "four"]
