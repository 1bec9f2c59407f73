"""The option objects of one decoding call and of `mtkit translate`: `Decoding`, `Sampling` and `FileOptions`,
every default once. Kept free of torch, so the command line and the server's request read their defaults here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mtkit.config import SAMPLING_SEED, SAMPLING_TEMPERATURE, TEMPERATURE
from mtkit.errors import OptionError
from mtkit.options import BadBytes

SEED_LIMIT = 2**64 - 1  # torch's generators take 64-bit seeds
BUFFER_LINES = 10_000  # input lines held, length-sorted and translated together


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Draw each token instead of searching: from the `top_k` most probable tokens (0: all), or
    from the fewest whose probabilities reach `top_p`, after dividing the logits by `temperature`."""

    top_k: int = 0
    top_p: float = 1.0
    temperature: float = SAMPLING_TEMPERATURE
    seed: int = SAMPLING_SEED

    @classmethod
    def parse(cls, text: str, temperature: float = SAMPLING_TEMPERATURE, *, seed: int = SAMPLING_SEED) -> Sampling:
        """`topk:K`, `topp:P` or `full` (the option `--sampling`), checked."""
        kind, _, value = text.partition(":")
        if not TEMPERATURE.admits(temperature):
            raise OptionError(
                "temperature",
                "{temperature} {value}: give {range}, such as 1.0 (sharper below 1)",
                value=temperature,
                range=TEMPERATURE.describe(whole=False),
            )
        if not 0 <= seed <= SEED_LIMIT:
            raise OptionError("seed", "{seed} {value}: give a whole number from 0 to 2^64-1, such as 1", value=seed)
        try:
            if kind == "full" and not value:
                return cls(temperature=temperature, seed=seed)
            if kind == "topk" and int(value) >= 1:
                return cls(top_k=int(value), temperature=temperature, seed=seed)
            if kind == "topp" and 0.0 < float(value) <= 1.0:
                return cls(top_p=float(value), temperature=temperature, seed=seed)
        except ValueError:
            pass
        raise OptionError(
            "sampling", "{sampling} {value}: give topk:K (K >= 1), topp:P (0 < P <= 1) or full, such as topk:10", value=text
        )


@dataclass(frozen=True, kw_only=True)
class Decoding:
    """How one call decodes: the per-call options of `Translator` (None: the recipe's `DecodeConfig` value).
    Sampling draws `nbest` samples instead of searching.

    Built from the `mtkit translate` and `evaluate` flags, an HTTP request's body, or a synthetic
    corpus's `SyntheticDecodeConfig` (`mtkit.synthetic.generate`); `Translator.search_options` turns it,
    with `DecodeConfig`, into the search's own `SearchOptions`.
    """

    beam: int | None = None
    nbest: int = 1
    length_penalty: float | None = None
    sampling: Sampling | None = None
    no_repeat_ngram: int = 0
    alignments: bool = False
    alignment_layer: int = -1  # the decoder layer whose cross-attention aligns (-1: the last)
    constraints_in_order: bool = False  # lexical constraints must appear in the order given
    tgt_lang: str | None = None  # the language to write, for a model of several (data.lang_tag: target or code)
    src_lang: str | None = None  # the source's language, for a model with language codes (data.lang_tag: code)
    shortlist: bool | None = None  # search over the run's vocabulary shortlist (None: when the model has one)


@dataclass(frozen=True, kw_only=True)
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
    constraints: Path | None = None  # one JSON list of target phrases per input line
    glossary: Path | None = None  # source term TAB target term(s)


@dataclass(frozen=True, kw_only=True)
class ShortlistBuild:
    """How `mtkit shortlist` builds a run's vocabulary shortlist (`mtkit.decoding.shortlist.build_shortlist`)."""

    k: int = 100  # target pieces kept per source piece (Bergamot's students decode with 50 or 100)
    frequent: int = 200  # the most frequent target pieces, kept in every batch
    lines: int = 300_000  # training pairs aligned at most (the first ones)
    src: Path | None = None  # a parallel corpus to align instead of the run's prepared training data
    tgt: Path | None = None
