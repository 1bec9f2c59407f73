"""`mtkit translate` and `mtkit score` as library calls: a file or stream in, a file or stream out.

`translate_file` checks the options before any work, reads the input in windows (so memory stays
flat and a line piped in is answered at once), translates each window with a `Translator`, writes
plain or n-best lines in input order as soon as a window is done, draws attention heatmaps when
asked, and says on stderr what the user should know (lines translated in segments, heatmaps
written, translations that lack a constraint). `--constraints` and `--glossary` files are read, and
every term is checked against the model's vocabulary, before anything is translated. An output
file is written under a temporary name and renamed when complete, so an interrupted run never
leaves a half-written file in its place. `score_files` does the same for pairs of files, one
score line per pair (`mtkit.decoding.pair_scores`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from mtkit.decoding.alignment import pharaoh
from mtkit.decoding.engine import Capability
from mtkit.decoding.heatmaps import check_can_plot, plot_attention
from mtkit.decoding.line_parts import Splitter
from mtkit.decoding.options import BUFFER_LINES, Decoding, FileOptions
from mtkit.decoding.terminology.terms import Glossary, Term, parse_constraints
from mtkit.decoding.translator import Translation, Translator
from mtkit.distributed import Distributed, gather_in_order
from mtkit.errors import MtkitError
from mtkit.options import BadBytes
from mtkit.textio import atomic_output, count_lines, file_lines, line_windows, model_text, say

WINDOW_PAIRS = 10_000  # pairs scored together by score_files


class Chooser(Protocol):
    """Picks each line's translation among the candidates the search found (`mtkit.evaluation.rerank.Reranker`,
    which lives above decoding: it scores with evaluation's metrics)."""

    def check(self, translator: Translator, decoding: Decoding) -> None:
        """One line when `decoding` cannot give the candidates."""

    def choose(self, sources: Sequence[str], candidates: list[list[Translation]]) -> list[list[Translation]]:
        """Each line's candidates, the chosen one first."""


def translate_file(
    translator: Translator,
    options: FileOptions,
    *,
    distributed: Distributed | None = None,
    chooser: Chooser | None = None,
    splitter: Splitter | None = None,
) -> int:
    """Translate `options.input` into `options.output`, one output line per input line, in order (with `chooser`: the one
    it picks among each line's `options.decoding.nbest` candidates; with `splitter`: each line cut into the sentences
    translated, the sentences of a window together); returns the number of lines translated. Under torchrun
    (`distributed`), every rank reads the input file and translates every N-th line of each window; rank 0 gathers the
    translations and writes them in input order."""
    distributed = distributed or Distributed()
    _check(translator, options, distributed, chooser)
    glossary = _checked_terms(translator, options)
    windows = line_windows(
        options.input, options.buffer_lines, bad_bytes=BadBytes(options.bad_bytes).value, fix=" or pass --bad-bytes replace"
    )
    prefixes = _side_lines(options.prefix, "--prefix", options.input, "target prefix")
    constraint_lines = _side_lines(options.constraints, "--constraints", options.input, "list of constraints")
    done = plotted = split_lines = lacking = 0
    bar = tqdm(unit=" lines", disable=None if options.output is not None and distributed.is_main else True, file=sys.stderr)
    mine = slice(distributed.rank, None, distributed.world_size)  # this rank's lines of a window
    shown = 1 if chooser is not None else options.decoding.nbest  # translations printed per line
    with atomic_output(options.output, discard=not distributed.is_main) as out:
        for window in windows:
            window_prefixes = _take(prefixes, len(window), options.prefix, "--prefix")
            shares = [text for _, text in window_prefixes[mine]] if window_prefixes is not None else None
            given = _take(constraint_lines, len(window), options.constraints, "--constraints")
            terms = _window_terms(window, given, options.constraints, glossary, translator.normalize)
            terms_share = terms[mine] if terms is not None else None
            plan = translator.plan(window[mine], options.decoding, prefixes=shares, constraints=terms_share, splitter=splitter)
            results = gather_in_order(_chosen(translator.search(plan), window[mine], chooser), distributed)
            split_lines += plan.split_lines
            lacking += sum(bool(best[0].unmet) for best in results if best)
            out.write("".join(render(best, shown, alignments=options.decoding.alignments) + "\n" for best in results))
            out.flush()
            if options.plot_attention is not None and plotted < options.plot_count:
                plotted += _plot(translator, window, results, done, options.plot_count - plotted, options)
            done += len(window)
            bar.update(len(window))
    bar.close()
    for lines, path in ((prefixes, options.prefix), (constraint_lines, options.constraints)):
        if lines is not None and next(lines, None) is not None:
            raise MtkitError(f"{path} has more lines than the input ({done}); give one line per input line")
    if options.plot_attention is not None:
        say(f"mtkit: wrote {plotted} attention heatmaps to {options.plot_attention}")
    _say_warnings(lacking=lacking, split_lines=sum(gather_in_order([split_lines], distributed)))
    return done


def _say_warnings(*, lacking: int, split_lines: int) -> None:
    """Warn of translations that lack a constraint and of input lines translated in segments, if any."""
    if lacking:
        say(
            f"mtkit: warning: {lacking} translations lack a constraint: the output cap (decode.max_len_a, max_len_b) "
            "came first; check those terms fit the sentence"
        )
    if split_lines:
        say(f"mtkit: warning: {split_lines} input lines were longer than decode.max_input_tokens and were translated in segments")


def render(translations: list[Translation], nbest: int, *, alignments: bool = False) -> str:
    """One output line: the best translation, or with nbest > 1 each translation and its score,
    tab-separated; with `alignments`, each translation is followed by a tab and its Pharaoh pairs (a tab inside a
    translation, a paragraph's spacing, stays only where it cannot be taken for a field's end)."""
    fields, tabbed = [], nbest > 1 or alignments
    for translation in translations[: max(nbest, 1)]:
        text = translation.text.replace("\r", " ").replace("\n", " ")
        fields.append(text.replace("\t", " ") if tabbed else text)
        if nbest > 1:
            fields.append(f"{translation.score:.4f}")
        if alignments:
            fields.append(pharaoh(translation.alignment or []))
    return "\t".join(fields)


def _chosen(found: list[list[Translation]], sources: Sequence[str], chooser: Chooser | None) -> list[list[Translation]]:
    return chooser.choose(sources, found) if chooser is not None else found


def _check(translator: Translator, options: FileOptions, distributed: Distributed, chooser: Chooser | None) -> None:
    """Refuse impossible options before reading or translating anything."""
    if chooser is not None:
        chooser.check(translator, options.decoding)
    if distributed.enabled and options.input is None:
        raise MtkitError("under torchrun every process reads the input itself: give it as a file with -i FILE")
    if distributed.enabled and options.plot_attention is not None:
        raise MtkitError("--plot-attention draws in one process: run mtkit translate without torchrun to plot")
    if options.output is not None and not options.output.parent.is_dir():
        raise MtkitError(f"{options.output}: its directory does not exist; create it or choose another --output")
    if options.buffer_lines < 1:
        raise MtkitError(f"--buffer-lines {options.buffer_lines}: give a number of lines >= 1, such as {BUFFER_LINES}")
    if options.plot_attention is not None:
        check_can_plot(translator)
    translator.leads(options.decoding)  # a missing or unknown --tgt-lang (or --src-lang)


def _side_lines(path: Path | None, option: str, input: Path | None, what: str) -> Iterator[tuple[int, str]] | None:
    """The (number, text) lines of a file given line by line beside the input (--prefix, --constraints),
    after checking they are as many as the input file's (when it is a file)."""
    if path is None:
        return None
    if not path.is_file():
        raise MtkitError(f"{option} {path}: no such file; give one {what} per input line")
    if input is not None:
        counts = [count_lines(p) for p in (input, path)]
        if counts[0] != counts[1]:
            raise MtkitError(
                f"{option} {path} has {counts[1]} lines but {input} has {counts[0]}: give one {what} per input line "
                "(an empty line for none)"
            )
    return file_lines(path)


def _take(lines: Iterator[tuple[int, str]] | None, count: int, path: Path | None, option: str) -> list[tuple[int, str]] | None:
    if lines is None:
        return None
    taken = list(islice(lines, count))
    if len(taken) < count:
        raise MtkitError(f"{option} {path} has fewer lines than the input; give one line per input line")
    return taken


def _checked_terms(translator: Translator, options: FileOptions) -> Glossary | None:
    """The glossary, and every term of --constraints and --glossary checked against the model, before any work."""
    glossary = Glossary.load(options.glossary, translator.normalize) if options.glossary is not None else None
    terms = (
        [Term(alternatives=targets, source=source, where=where) for source, targets, where in glossary.entries]
        if glossary
        else []
    )
    if options.constraints is not None and options.constraints.is_file():
        for number, text in file_lines(options.constraints):
            terms += parse_constraints(text, f"{options.constraints}:{number}")
    if terms or options.constraints is not None:
        translator.line_terms(
            [""], [terms], options=translator.search_options(options.decoding)
        )  # beam search, an engine that can
    for term in terms:
        translator.encoded_term(term)
    return glossary


def _window_terms(
    window: list[str], lines: list[tuple[int, str]] | None, path: Path | None, glossary: Glossary | None, normalize: str
) -> list[list[Term]] | None:
    """Each input line's constraints: its line of --constraints, then the glossary's terms for it."""
    if lines is None and glossary is None:
        return None
    given: list[list[Term]] = [[] for _ in window]
    if lines is not None:
        given = [parse_constraints(text, f"{path}:{number}") for number, text in lines]
    if glossary is not None:
        given = [terms + glossary.terms_for(model_text(line, normalize)) for terms, line in zip(given, window, strict=True)]
    return given


def _plot(
    translator: Translator, lines: list[str], results: list[list[Translation]], offset: int, count: int, options: FileOptions
) -> int:
    """Heatmaps for up to `count` non-empty lines of a window whose first line is input line offset + 1."""
    best = [found[0] for found in results]
    assert options.plot_attention is not None
    directory, heads, tgt_lang = options.plot_attention, options.plot_heads, options.decoding.tgt_lang
    drawn = plot_attention(
        translator, lines=lines, translations=best, directory=directory, count=count, per_head=heads, offset=offset,
        tgt_lang=tgt_lang,
    )  # fmt: skip
    return len(drawn)


def score_files(
    translator: Translator,
    src: Path,
    *,
    tgt: Path,
    output: Path | None,
    as_json: bool = False,
    tgt_lang: str | None = None,
    src_lang: str | None = None,
) -> list[int]:
    """Write one score line per pair of `src` and `tgt` lines (in `tgt_lang`, for a model of several; `src_lang` and
    `tgt_lang`, for a model with language codes) into `output` (stdout when None).

    Returns the line numbers (1-based) of pairs scored on their first pieces only.
    """
    translator.leads(Decoding(src_lang=src_lang, tgt_lang=tgt_lang))  # an unknown language, refused before reading
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
            scores = translator.score(
                [s for (_, s), _ in window], [t for _, (_, t) in window], tgt_lang=tgt_lang, src_lang=src_lang
            )
            out.write("".join((score.json() if as_json else score.line()) + "\n" for score in scores))
            truncated += [number for ((number, _), _), score in zip(window, scores, strict=True) if score.truncated]
            bar.update(len(window))
    bar.close()
    return truncated
