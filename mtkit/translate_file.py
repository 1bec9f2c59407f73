"""`mtkit translate` as one library call: a file or stream in, a file or stream out.

`translate_file` checks the options before any work, reads the input in windows (so memory stays
flat and a line piped in is answered at once), translates each window with a `Translator`, writes
plain or n-best lines in input order as soon as a window is done, draws attention heatmaps when
asked, and says on stderr what the user should know (lines translated in segments, heatmaps
written). An output file is written under a temporary name and renamed when complete, so an
interrupted run never leaves a half-written file in its place.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tqdm import tqdm

from mtkit.choices import BadBytes
from mtkit.distributed import Distributed, gather_in_order
from mtkit.errors import MtkitError
from mtkit.textio import line_windows
from mtkit.translate import Translation, Translator

BUFFER_LINES = 10_000  # input lines held, length-sorted and translated together


@dataclass
class FileOptions:
    """What `mtkit translate` was asked for (None: the recipe's decoding default)."""

    input: Path | None = None  # None: standard input
    output: Path | None = None  # None: standard output
    beam: int | None = None
    nbest: int = 1
    length_penalty: float | None = None
    bad_bytes: BadBytes = BadBytes.ERROR
    plot_attention: Path | None = None  # directory for heatmap PNGs
    plot_count: int = 10
    plot_heads: bool = False
    buffer_lines: int = BUFFER_LINES


def translate_file(translator: Translator, options: FileOptions, job: Distributed | None = None) -> int:
    """Translate `options.input` into `options.output`, one output line per input line, in order.

    Under torchrun (`job`), every rank reads the input file and translates every N-th line of each
    window; rank 0 gathers the translations and writes them in input order. Returns the number of
    lines translated.
    """
    job = job or Distributed()
    _check(translator, options, job)
    windows = line_windows(options.input, options.buffer_lines, BadBytes(options.bad_bytes).value, " or pass --bad-bytes replace")
    done = plotted = 0
    bar = tqdm(unit=" lines", disable=None if options.output is not None and job.is_main else True, file=sys.stderr)
    with _output(options.output, discard=not job.is_main) as out:
        for window in windows:
            plan = translator.plan(window[job.rank :: job.world_size], options.beam, options.nbest, options.length_penalty)
            for batch in plan.batches():  # the loop of Translator.translate_nbest, one call nearer the model
                plan.put(batch, translator.engine.search(batch.sources, batch.max_len, plan.beam, plan.nbest, plan.alpha))
            results = gather_in_order(plan.results(), job)
            out.write("".join(render(best, options.nbest) + "\n" for best in results))
            out.flush()
            if options.plot_attention is not None and plotted < options.plot_count:
                plotted += _plot(translator, window, results, done, options.plot_count - plotted, options)
            done += len(window)
            bar.update(len(window))
    bar.close()
    split_lines = sum(gather_in_order([translator.split_lines], job))
    if options.plot_attention is not None:
        _say(f"mtkit: wrote {plotted} attention heatmaps to {options.plot_attention}")
    if split_lines:
        _say(
            f"mtkit: warning: {split_lines} input lines were longer than decode.max_input_tokens and were translated in segments"
        )
    return done


def render(translations: list[Translation], nbest: int) -> str:
    """One output line: the best translation, or with nbest > 1 each translation and its score, tab-separated."""
    if nbest == 1:
        text = translations[0].text
    else:
        text = "\t".join(f"{t.text}\t{t.score:.4f}" for t in translations)
    return text.replace("\r", " ").replace("\n", " ")


def _check(translator: Translator, options: FileOptions, job: Distributed) -> None:
    """Refuse impossible options before reading or translating anything."""
    if job.enabled and options.input is None:
        raise MtkitError("under torchrun every process reads the input itself: give it as a file with -i FILE")
    if job.enabled and options.plot_attention is not None:
        raise MtkitError("--plot-attention draws in one process: run mtkit translate without torchrun to plot")
    if options.output is not None and not options.output.parent.is_dir():
        raise MtkitError(f"{options.output}: its directory does not exist; create it or choose another --output")
    if options.buffer_lines < 1:
        raise MtkitError(f"--buffer-lines {options.buffer_lines}: give a number of lines >= 1, such as {BUFFER_LINES}")
    if options.plot_attention is not None:
        from mtkit.attention_plot import check_can_plot

        check_can_plot(translator)


@contextlib.contextmanager
def _output(path: Path | None, discard: bool = False) -> Iterator[IO[str]]:
    """Standard output, or a temporary file next to `path` that replaces it once complete (or nowhere: `discard`)."""
    if discard:
        with open(os.devnull, "w", encoding="utf-8") as nowhere:
            yield nowhere
        return
    if path is None:
        yield sys.stdout
        return
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            yield file
        os.replace(temporary, path)
    except OSError as err:
        raise MtkitError(f"{path}: cannot write ({err.strerror}); check the directory is writable") from None
    finally:
        Path(temporary).unlink(missing_ok=True)


def _plot(
    translator: Translator, lines: list[str], results: list[list[Translation]], offset: int, count: int, options: FileOptions
) -> int:
    """Heatmaps for up to `count` non-empty lines of a window whose first line is input line offset + 1."""
    from mtkit.attention_plot import plot_attention

    best = [found[0] for found in results]
    assert options.plot_attention is not None
    return len(plot_attention(translator, lines, best, options.plot_attention, count, options.plot_heads, offset))


def _say(message: str) -> None:
    print(message, file=sys.stderr)
