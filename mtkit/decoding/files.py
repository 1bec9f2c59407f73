"""`mtkit translate` and `mtkit score` as library calls: a file or stream in, a file or stream out.

`translate_file` checks the options before any work, reads the input in windows (so memory stays
flat and a line piped in is answered at once), translates each window with a `Translator`, writes
plain or n-best lines in input order as soon as a window is done, draws attention heatmaps when
asked, and says on stderr what the user should know (lines translated in segments, heatmaps
written). An output file is written under a temporary name and renamed when complete, so an
interrupted run never leaves a half-written file in its place. `score_files` does the same for
pairs of files, one score line per pair (`mtkit.decoding.pair_scores`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from tqdm import tqdm

from mtkit.decoding.alignment import pharaoh
from mtkit.decoding.engine import Capability
from mtkit.decoding.heatmaps import check_can_plot, plot_attention
from mtkit.decoding.translator import Decoding, Translation, Translator
from mtkit.distributed import Distributed, gather_in_order
from mtkit.errors import MtkitError
from mtkit.options import BadBytes
from mtkit.textio import atomic_output, count_lines, file_lines, line_windows

BUFFER_LINES = 10_000  # input lines held, length-sorted and translated together
WINDOW_PAIRS = 10_000  # pairs scored together by score_files


@dataclass
class FileOptions:
    """What `mtkit translate` was asked for (None: the recipe's decoding default)."""

    input: Path | None = None  # None: standard input
    output: Path | None = None  # None: standard output
    decoding: Decoding = field(default_factory=Decoding)
    prefix: Path | None = None  # one target prefix per input line (empty: none)
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
    prefixes = _prefix_lines(options)
    done = plotted = split_lines = 0
    bar = tqdm(unit=" lines", disable=None if options.output is not None and job.is_main else True, file=sys.stderr)
    with atomic_output(options.output, discard=not job.is_main) as out:
        for window in windows:
            window_prefixes = _take_prefixes(prefixes, len(window), options.prefix)
            shares = window_prefixes[job.rank :: job.world_size] if window_prefixes is not None else None
            plan = translator.plan(window[job.rank :: job.world_size], options.decoding, shares)
            results = gather_in_order(translator.search(plan), job)
            split_lines += plan.split_lines
            out.write("".join(render(best, options.decoding.nbest, options.decoding.alignments) + "\n" for best in results))
            out.flush()
            if options.plot_attention is not None and plotted < options.plot_count:
                plotted += _plot(translator, window, results, done, options.plot_count - plotted, options)
            done += len(window)
            bar.update(len(window))
    bar.close()
    if prefixes is not None and next(prefixes, None) is not None:
        raise MtkitError(f"{options.prefix} has more lines than the input ({done}); give one prefix line per input line")
    split_lines = sum(gather_in_order([split_lines], job))
    if options.plot_attention is not None:
        _say(f"mtkit: wrote {plotted} attention heatmaps to {options.plot_attention}")
    if split_lines:
        _say(
            f"mtkit: warning: {split_lines} input lines were longer than decode.max_input_tokens and were translated in segments"
        )
    return done


def render(translations: list[Translation], nbest: int, alignments: bool = False) -> str:
    """One output line: the best translation, or with nbest > 1 each translation and its score,
    tab-separated; with `alignments`, each translation is followed by a tab and its Pharaoh pairs."""
    fields = []
    for translation in translations[: max(nbest, 1)]:
        fields.append(translation.text.replace("\r", " ").replace("\n", " ").replace("\t", " "))
        if nbest > 1:
            fields.append(f"{translation.score:.4f}")
        if alignments:
            fields.append(pharaoh(translation.alignment or []))
    return "\t".join(fields)


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
        check_can_plot(translator)


def _prefix_lines(options: FileOptions) -> Iterator[str] | None:
    """The lines of --prefix, after checking they are as many as the input file's (when it is a file)."""
    if options.prefix is None:
        return None
    if not options.prefix.is_file():
        raise MtkitError(f"--prefix {options.prefix}: no such file; give one target prefix per input line")
    if options.input is not None:
        counts = [count_lines(path) for path in (options.input, options.prefix)]
        if counts[0] != counts[1]:
            raise MtkitError(
                f"--prefix {options.prefix} has {counts[1]} lines but {options.input} has {counts[0]}: "
                "give one prefix line per input line (an empty line for none)"
            )
    return (text for _, text in file_lines(options.prefix))


def _take_prefixes(prefixes: Iterator[str] | None, count: int, path: Path | None) -> list[str] | None:
    if prefixes is None:
        return None
    taken = list(islice(prefixes, count))
    if len(taken) < count:
        raise MtkitError(f"--prefix {path} has fewer lines than the input; give one prefix line per input line")
    return taken


def _plot(
    translator: Translator, lines: list[str], results: list[list[Translation]], offset: int, count: int, options: FileOptions
) -> int:
    """Heatmaps for up to `count` non-empty lines of a window whose first line is input line offset + 1."""
    best = [found[0] for found in results]
    assert options.plot_attention is not None
    return len(plot_attention(translator, lines, best, options.plot_attention, count, options.plot_heads, offset))


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def score_files(translator: Translator, src: Path, tgt: Path, output: Path | None, as_json: bool = False) -> list[int]:
    """Write one score line per pair of `src` and `tgt` lines into `output` (stdout when None).

    Returns the line numbers (1-based) of pairs scored on their first pieces only.
    """

    for path in (src, tgt):
        if not path.is_file():
            raise MtkitError(f"{path}: no such file; give a text file with one sentence per line")
    counts = [count_lines(path) for path in (src, tgt)]
    if counts[0] != counts[1]:
        raise MtkitError(f"{src} has {counts[0]} lines but {tgt} has {counts[1]}: give one target line per source line")
    translator.require(Capability.SCORE, "mtkit score")
    pairs = zip(file_lines(src), file_lines(tgt), strict=True)
    truncated: list[int] = []
    bar = tqdm(total=counts[0], unit=" pairs", disable=None if output is not None else True, file=sys.stderr)
    with atomic_output(output) as out:
        while window := list(islice(pairs, WINDOW_PAIRS)):
            scores = translator.score([s for (_, s), _ in window], [t for _, (_, t) in window])
            out.write("".join((score.json() if as_json else score.line()) + "\n" for score in scores))
            truncated += [number for ((number, _), _), score in zip(window, scores, strict=True) if score.truncated]
            bar.update(len(window))
    bar.close()
    return truncated
