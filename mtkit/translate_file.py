"""`mtkit translate` as one library call: a file or stream in, a file or stream out.

`translate_file` checks the options before any work, reads the input, translates it with a
`Translator`, renders plain or n-best output, writes attention heatmaps when asked, and says on
stderr what the user should know (lines translated in segments, heatmaps written).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from mtkit.choices import BadBytes
from mtkit.errors import MtkitError
from mtkit.textio import read_text_lines, write_lines
from mtkit.translate import Translation, Translator


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


def translate_file(translator: Translator, options: FileOptions) -> list[list[Translation]]:
    """Translate `options.input` into `options.output`, one output line per input line, in order."""
    _check(translator, options)
    lines = read_text_lines(options.input, BadBytes(options.bad_bytes).value, fix=" or pass --bad-bytes replace")
    results = translator.translate_nbest(
        lines, beam=options.beam, nbest=options.nbest, length_penalty=options.length_penalty, progress=options.output is not None
    )
    write_lines([render(best, options.nbest) for best in results], options.output)
    if options.plot_attention is not None:
        from mtkit.attention_plot import plot_attention

        best = [found[0] for found in results]
        written = plot_attention(translator, lines, best, options.plot_attention, options.plot_count, options.plot_heads)
        _say(f"mtkit: wrote {len(written)} attention heatmaps to {options.plot_attention}")
    if translator.split_lines:
        _say(
            f"mtkit: warning: {translator.split_lines} input lines were longer than decode.max_input_tokens "
            "and were translated in segments"
        )
    return results


def render(translations: list[Translation], nbest: int) -> str:
    """One output line: the best translation, or with nbest > 1 each translation and its score, tab-separated."""
    if nbest == 1:
        return translations[0].text
    return "\t".join(f"{t.text}\t{t.score:.4f}" for t in translations)


def _check(translator: Translator, options: FileOptions) -> None:
    """Refuse impossible options before reading or translating anything."""
    if options.output is not None and not options.output.parent.is_dir():
        raise MtkitError(f"{options.output}: its directory does not exist; create it or choose another --output")
    if options.plot_attention is not None:
        from mtkit.attention_plot import check_can_plot

        check_can_plot(translator)


def _say(message: str) -> None:
    print(message, file=sys.stderr)
