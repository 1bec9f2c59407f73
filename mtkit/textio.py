"""Plain-text lines in and out (files or stdin/stdout), with one-line errors for bad bytes."""

from __future__ import annotations

import sys
from pathlib import Path

from mtkit.errors import MtkitError


def decode_lines(data: bytes, name: str, bad_bytes: str = "error") -> list[str]:
    """UTF-8 bytes -> lines without "\\n"/"\\r"; splits on "\\n" only so parallel files stay aligned.

    `bad_bytes="replace"` turns bytes that are not UTF-8 into U+FFFD and warns how many lines had them.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        if bad_bytes == "replace":
            return _replace_bad_bytes(data, name)
        line_number = data.count(b"\n", 0, err.start) + 1
        raise MtkitError(f"{name}:{line_number}: not valid UTF-8; convert the file to UTF-8") from None
    # A byte-order mark would otherwise become part of the first sentence.
    text = text.removeprefix("\ufeff")
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    return [line.removesuffix("\r") for line in lines]


def _replace_bad_bytes(data: bytes, name: str) -> list[str]:
    lines = decode_lines(data.decode("utf-8", errors="replace").encode("utf-8"), name)
    damaged = sum(1 for raw in data.split(b"\n") if raw.decode("utf-8", errors="replace").encode("utf-8") != raw)
    print(f"mtkit: warning: {name}: replaced bytes that are not UTF-8 on {damaged} lines", file=sys.stderr)
    return lines


def read_lines(path: Path, bad_bytes: str = "error") -> list[str]:
    """Read a UTF-8 text file as one string per line."""
    return decode_lines(_read_bytes(Path(path)), str(path), bad_bytes)


def read_text_lines(path: Path | None, bad_bytes: str = "error") -> list[str]:
    """Lines of `path`, or of standard input when `path` is None."""
    if path is None:
        return decode_lines(sys.stdin.buffer.read(), "<stdin>", bad_bytes)
    return read_lines(path, bad_bytes)


def write_lines(lines: list[str], path: Path | None) -> None:
    """Write one line per item (inner newlines become spaces) to `path` or standard output."""
    text = "".join(line.replace("\r", " ").replace("\n", " ") + "\n" for line in lines)
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as err:
        raise MtkitError(f"{path}: cannot write ({err.strerror}); check the directory exists and is writable") from None


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise MtkitError(f"{path}: file not found; check the path") from None
    except IsADirectoryError:
        raise MtkitError(f"{path}: is a directory; pass a text file with one sentence per line") from None
    except OSError as err:
        raise MtkitError(f"{path}: cannot be read ({err.strerror}); check its permissions") from None
