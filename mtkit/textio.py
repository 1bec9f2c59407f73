"""Files in and out: plain-text lines (files, gzip files or stdin/stdout) with UTF-8 decoding, one-line
errors for bad bytes and the line as the model reads it; and the one writer of every file mtkit
writes (`atomic_file`). Corpora, hypotheses, references and `translate` input are all read through
`text_lines`; recipes, a run's config.yaml and COMET's hparams.yaml through `parse_yaml`.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import os
import re
import select
import stat
import sys
import tempfile
import unicodedata
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar

import yaml
from tqdm import tqdm

from mtkit.errors import MtkitError, one_line

if TYPE_CHECKING:  # only its type: mtkit.distributed imports torch, which text files do not need
    from mtkit.distributed import Distributed

T = TypeVar("T")
BYTE_ORDER_MARK = "\ufeff"
# PyYAML's safe loader with libyaml's scanner and parser in C where PyYAML was built with it: the same values and
# the same error classes as `yaml.safe_load`, read many times faster.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def say(message: str, *, distributed: Distributed | None = None) -> None:
    """A status line on stderr, flushed at once, that does not break a tqdm progress bar on stderr (the
    bar is lifted, the line written, the bar drawn again). Under torchrun (`distributed`) only rank 0
    speaks, so a torchrun job prints each line once."""
    if distributed is not None and not distributed.is_main:
        return
    tqdm.write(message, file=sys.stderr)  # sys.stderr at call time: a test or a redirect may have replaced it
    sys.stderr.flush()


def parse_yaml(text: str) -> Any:
    """`yaml.safe_load(text)` through `SAFE_LOADER`; every way the text is not readable YAML is a yaml.YAMLError.

    PyYAML's constructors let Python's own errors escape for values they cannot build: an integer of more than
    4,300 digits (Python's limit), a date out of range, `!!bool maybe`. They are YAML errors of the file too, so
    every caller's one `except yaml.YAMLError` names the file.
    """
    try:
        return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506  a safe loader
    except (ValueError, KeyError, AttributeError) as err:
        raise yaml.YAMLError(f"a value YAML cannot build: {one_line(err, 100)}") from None


def model_text(line: str, normalize: str) -> str:
    """A line as the model reads it, in training and in translation: stripped, Unicode-normalised.

    Lone surrogates (possible in Python strings, never in UTF-8 input) become "?".
    """
    text = line.strip().encode("utf-8", errors="replace").decode("utf-8")
    return unicodedata.normalize(normalize, text).strip() if normalize != "none" else text


def text_lines(raw_lines: Iterable[bytes], name: str, *, bad_bytes: str = "error", fix: str = "") -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of UTF-8 byte lines, without line ending or byte-order mark.

    Lines are split on "\\n" only (a "\\r" before it is dropped), so parallel files stay aligned.
    Bytes that are not UTF-8 stop with an error naming `name`, the line and column (`fix` adds
    another remedy), or with `bad_bytes="replace"` become U+FFFD, and the damaged lines are counted
    in one warning at the end.
    """
    replaced = 0
    for number, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            if bad_bytes != "replace":
                column = len(raw[: err.start].decode("utf-8", errors="replace")) + 1
                raise MtkitError(
                    f"{name}:{number}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at column {column}); "
                    f"convert the file to UTF-8{fix}"
                ) from None
            text, replaced = raw.decode("utf-8", errors="replace"), replaced + 1
        text = text.removesuffix("\n").removesuffix("\r")
        yield number, text.removeprefix(BYTE_ORDER_MARK) if number == 1 else text
    if replaced:
        say(f"mtkit: warning: {name}: replaced bytes that are not UTF-8 on {replaced} lines")


def decode_lines(data: bytes, name: str, *, bad_bytes: str = "error", fix: str = "") -> list[str]:
    """UTF-8 bytes -> lines (see `text_lines`)."""
    return [text for _, text in text_lines(io.BytesIO(data), name, bad_bytes=bad_bytes, fix=fix)]


def open_binary(path: Path) -> IO[bytes]:
    """A file (gzip-compressed if its name ends in .gz) opened for reading bytes, or a one-line error."""
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")
    except FileNotFoundError:
        raise MtkitError(f"{path}: file not found; check the path") from None
    except IsADirectoryError:
        raise MtkitError(f"{path}: is a directory; pass a text file with one sentence per line") from None
    except OSError as err:
        raise MtkitError(f"{path}: cannot be read ({err.strerror}); check its permissions") from None


def file_lines(path: Path, bad_bytes: str = "error", *, fix: str = "", progress: bool = False) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of a UTF-8 text file (.gz fine), read lazily; see `text_lines`."""
    with open_binary(path) as handle:
        raw_lines = tqdm(handle, desc=f"reading {path.name}", unit=" lines", leave=False) if progress else handle
        try:
            yield from text_lines(raw_lines, str(path), bad_bytes=bad_bytes, fix=fix)
        except (gzip.BadGzipFile, EOFError) as err:
            raise MtkitError(f"{path}: damaged gzip file ({err}); decompress it or download it again") from None


# `atomic_file`'s temporary files: .NAME.<8 of mkstemp's random characters>.tmp beside NAME
TEMPORARY_SUFFIX = ".tmp"
TEMPORARY_RANDOM = re.compile(r"[a-z0-9_]{8}")


@contextlib.contextmanager
def atomic_file(path: Path | str, *, binary: bool = False, mode: int = 0o666) -> Iterator[IO]:
    """The one writer of every file mtkit writes: a temporary file in `path`'s directory, flushed to
    disk (fsync), then renamed onto `path` with the mode a new file gets (`mode`, by default 0666, less the umask).

    A reader sees the old file or the whole new one, never a part. If the block raises, `path` is
    left as it was and the temporary file is removed; only a killed process leaves one
    (`leftover_temporaries` finds them). A failed write is a `MtkitError` naming `path`.
    """
    path = Path(path)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
    except OSError as err:
        raise MtkitError(f"{path}: cannot write ({err.strerror}); check the directory exists and is writable") from None
    try:
        with os.fdopen(handle, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode & ~_umask())
        os.replace(temporary, path)
        _fsync_directory(path.parent)
    except OSError as err:
        raise MtkitError(f"{path}: cannot write ({err.strerror}); check the directory is writable and has space") from None
    finally:
        Path(temporary).unlink(missing_ok=True)


def write_file(path: Path | str, data: str | bytes, *, mode: int = 0o666) -> None:
    """Replace `path` with `data` (text as UTF-8) through `atomic_file` (`mode` less the umask)."""
    with atomic_file(path, binary=isinstance(data, bytes), mode=mode) as file:
        file.write(data)


def leftover_temporaries(directory: Path, name: str) -> list[Path]:
    """The temporary files that killed `atomic_file` writes of `name` (a glob such as step_*.pt) left in `directory`:
    nothing removes them but this (a live writer's too match: call it only where no writer can be running)."""
    found = directory.glob(f".{name}.{'?' * 8}{TEMPORARY_SUFFIX}")
    return sorted(path for path in found if TEMPORARY_RANDOM.fullmatch(path.name.removesuffix(TEMPORARY_SUFFIX)[-8:]))


@contextlib.contextmanager
def atomic_output(path: Path | None, *, discard: bool = False) -> Iterator[IO[str]]:
    """Standard output, or `atomic_file(path)` (or nowhere: `discard`, for ranks other than the first)."""
    if discard:
        with open(os.devnull, "w", encoding="utf-8") as nowhere:
            yield nowhere
    elif path is None:
        yield sys.stdout
        sys.stdout.flush()
    else:
        with atomic_file(path) as file:
            yield file


def _umask() -> int:
    """The process's umask. Linux reports it in /proc without changing it; elsewhere it is set and restored."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (where the system allows opening a directory)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def count_lines(path: Path) -> int:
    """The number of lines of a (possibly gzipped) text file."""
    with open_binary(path) as handle:
        return sum(1 for _ in handle)


def read_bounded_text(path: Path, *, most_bytes: int, fix: str) -> str:
    """A UTF-8 file that mtkit wrote beside a model, its size checked before it is read: too large, or not UTF-8,
    is one line naming it and `fix`."""
    size = path.stat().st_size
    if size > most_bytes:
        raise MtkitError(f"{path}: {size} bytes, more than the {most_bytes} such a file may hold; {fix}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise MtkitError(f"{path}: not UTF-8 text at byte {err.start}; {fix}") from None


def loaded_while_unchanged(path: Path, load: Callable[[Path], T]) -> T:
    """`load(path)`, read again only once the file changes (its modification time or size): a file beside a model
    that every request would otherwise parse."""
    stat = path.stat()
    return _loaded(load, path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _loaded(load: Callable[[Path], T], path: Path, mtime_ns: int, size: int) -> T:
    return load(path)


def read_lines(path: Path, bad_bytes: str = "error", *, fix: str = "") -> list[str]:
    """Read a UTF-8 text file (.gz fine) as one string per line."""
    return [text for _, text in file_lines(Path(path), bad_bytes, fix=fix)]


# The longest line `line_windows` reads (without its "\n"): a paragraph or a page fits many times over, and a line
# that never ends (a stream of bytes without "\n") is one error, not all of memory
MAX_LINE_BYTES = 16 << 20
READ_BYTES = 1 << 16  # what one read of a pipe or terminal asks for


def line_windows(path: Path | None, size: int, *, bad_bytes: str = "error", fix: str = "") -> Iterator[list[str]]:
    """Lines of `path` (standard input when None) in windows of at most `size`, read as they come.

    A window is also given out early when no more input is waiting (a pipe or a terminal with a
    partial or no next line), so a line written into a pipe is answered without waiting for the
    end of input. Memory holds one window, whatever the input's size; a line of more than
    `MAX_LINE_BYTES` is one error naming it.
    """
    with _LineSource.open(path) as source:
        window: list[str] = []
        for _, text in text_lines(source.lines(), source.name, bad_bytes=bad_bytes, fix=fix):
            window.append(text)
            if len(window) >= size or not source.ready():
                yield window
                window = []
        if window:
            yield window


class _LineSource:
    """Byte lines of a file or stream as they arrive, each of at most `MAX_LINE_BYTES`, and whether another is ready
    without waiting."""

    def __init__(self, handle: IO[bytes], name: str, fd: int | None) -> None:
        self.handle, self.name, self.fd = handle, name, fd  # fd: a pipe or terminal to poll; None: never waits
        self.max_line_bytes = MAX_LINE_BYTES
        self.pending: deque[bytes] = deque()
        # the pieces of a line not ended yet, joined once when it ends: a long line is not copied at every read
        self.partial: list[bytes] = []
        self.partial_size = 0
        self.count = 0  # the lines read so far
        self.ended = False

    @classmethod
    def open(cls, path: Path | None) -> _LineSource:
        if path is not None:
            return cls(open_binary(Path(path)), str(path), None)
        try:
            fd = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):  # a stand-in stdin (tests) is never waiting
            return cls(sys.stdin.buffer, "<stdin>", None)
        return cls(sys.stdin.buffer, "<stdin>", None if stat.S_ISREG(os.fstat(fd).st_mode) else fd)

    def __enter__(self) -> _LineSource:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not sys.stdin.buffer:
            self.handle.close()

    def lines(self) -> Iterator[bytes]:
        if self.fd is None:
            yield from self._file_lines()
            return
        while not self.ended or self.pending:
            if not self.pending:
                self._read()
            if self.pending:
                yield self.pending.popleft()

    def ready(self) -> bool:
        """Whether the next line can be had without waiting for more input."""
        return self.fd is None or bool(self.pending) or self.ended or bool(select.select([self.fd], [], [], 0)[0])

    def _file_lines(self) -> Iterator[bytes]:
        """The lines of a file (or of a stand-in or redirected stdin), none read past a byte over the cap."""
        while line := self.handle.readline(self.max_line_bytes + 1):
            self.count += 1
            if len(line) > self.max_line_bytes and not line.endswith(b"\n"):
                self._refuse(self.count)
            yield line

    def _read(self) -> None:
        chunk = os.read(self.fd, READ_BYTES)  # what has arrived (waits only when nothing has)
        if not chunk:
            self.ended = True
            if self.partial:
                self._take([b"".join(self.partial)], ending=b"")
            return
        *complete, rest = chunk.split(b"\n")  # only the new bytes are searched
        if complete:
            complete[0] = b"".join([*self.partial, complete[0]])
            self.partial, self.partial_size = [], 0
            self._take(complete)
        if rest:
            self.partial.append(rest)
            self.partial_size += len(rest)
            if self.partial_size > self.max_line_bytes:
                self._refuse(self.count + 1)

    def _take(self, lines: list[bytes], ending: bytes = b"\n") -> None:
        """Queue `lines` (without their endings), or stop at the first over the cap."""
        if max(map(len, lines)) > self.max_line_bytes:
            self._refuse(self.count + 1 + next(i for i, line in enumerate(lines) if len(line) > self.max_line_bytes))
        self.pending.extend(line + ending for line in lines)
        self.count += len(lines)

    def _refuse(self, number: int) -> NoReturn:
        raise MtkitError(
            f"{self.name}:{number}: a line of more than {self.max_line_bytes:,} bytes; split it into lines of at most "
            "that size (a sentence or a paragraph a line)"
        )


def write_lines(lines: list[str], path: Path | None) -> None:
    """Write one line per item (inner newlines become spaces) to `path` (through `atomic_file`) or standard output."""
    with atomic_output(path) as out:
        out.write("".join(line.replace("\r", " ").replace("\n", " ") + "\n" for line in lines))
