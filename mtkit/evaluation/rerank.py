"""Choosing among candidate translations (`mtkit translate --rerank qe|mbr --candidates N`).

The search finds N candidates per line (a beam's n-best, or N samples); one is returned:
- `qe`: the candidate a reference-free COMET model (COMET-QE, CometKiwi) scores highest from the source alone;
- `mbr`: minimum-Bayes-risk, the candidate that agrees most with the others: the highest mean utility with
  each other candidate taken as its reference, by sentence chrF (sacrebleu's) or a reference-based COMET model.

A text found several times (two tokenisations of one sentence, or a repeated sample) is scored once and counted
as often as it was found: in MBR it is evidence, as the samples of a distribution are. Ties go to the candidate
the search ranked first.

A server counts a reranking's cost before it starts (`Reranker.work`, in the units of decoding work) and can stop
it between chunks of its scorings (`choose`'s `stop`), as it stops a search between steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translation, Translator
from mtkit.errors import OptionError
from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.comet.scorer import CometScorer
from mtkit.evaluation.metrics import METRICS

Triple = tuple[str, str, str]  # (source, hypothesis, reference)
Item = TypeVar("Item")
# What one scoring counts as in a request's work, whose unit is a decoding step of one beam row: a sentence chrF
# costs about that, and a COMET scoring runs two or three whole sentences through a large encoder.
CHRF_WORK = 1
COMET_WORK = 64
CHRF_CHUNK = 256  # sentence chrF scorings between two looks at `stop` (COMET's: one batch)


class RerankStopped(Exception):
    """`choose` was told to stop (the client has gone, or the deadline passed); its choice is dropped."""


@dataclass(frozen=True, kw_only=True)
class RerankOptions:
    """How each line's translation is chosen among its candidates (None: no reranking, one translation searched)."""

    method: str | None = None  # "qe" or "mbr"
    candidates: int | None = None  # translations searched (beam n-best) or drawn (sampling) per line, 2 or more
    utility: str | None = None  # MBR's utility: "chrf" (None) or "comet"
    comet: CometOptions | None = None  # the COMET model of qe, or of MBR's comet utility


class Reranker:
    """Picks each line's translation among its candidates, as `RerankOptions` says (`decoding.files.Chooser`)."""

    def __init__(self, options: RerankOptions, scorer: CometScorer | None = None) -> None:
        self.options, self.scorer = options, scorer

    @classmethod
    def load(cls, options: RerankOptions, *, nbest: int = 1, scorer: CometScorer | None = None) -> Reranker | None:
        """The reranker the options ask for, its COMET model loaded (or `scorer`, loaded already for `options.comet`)
        and checked to be of the right kind; None without a method. Every mistake in the options is one line, before
        any model is loaded."""
        if options.method is None:
            _check_unused(options)
            return None
        _check_options(options, nbest)
        if options.comet is None:
            return cls(options)
        scorer = scorer or CometScorer.load(options.comet)
        model = options.comet.model
        if options.method == "qe" and scorer.needs_references:
            raise OptionError(
                "comet_model",
                "{comet_model} {model} scores against references; {rerank} qe needs a reference-free (QE) model such as "
                "Unbabel/wmt22-cometkiwi-da, or use it with {rerank} mbr {mbr_utility} comet",
                model=model,
            )
        if options.method == "mbr" and not scorer.needs_references:
            raise OptionError(
                "comet_model",
                "{comet_model} {model} is reference-free (QE); {mbr_utility} comet needs a reference-based model such as "
                "Unbabel/wmt22-comet-da, or use it with {rerank} qe",
                model=model,
            )
        return cls(options, scorer)

    @property
    def candidates(self) -> int:
        assert self.options.candidates is not None, "load checks that a method has its candidates"
        return self.options.candidates

    def check(self, translator: Translator, decoding: Decoding) -> None:
        """One line when the search cannot give the candidates: a beam finds at most its size."""
        beam = decoding.beam or translator.decode.beam
        if decoding.sampling is None and self.candidates > beam:
            raise OptionError(
                "candidates",
                "{candidates} {value} with a beam of {size}: a beam search finds at most its size; "
                "give {beam} {value} or more, or draw them with {sampling}",
                value=self.candidates,
                size=beam,
            )

    def scorings(self) -> int:
        """The most scorings one line's reranking makes: every ordered pair of its candidates for MBR (`mbr_pairs`
        of N candidates make at most N(N - 1)), each candidate for QE."""
        return self.candidates * (self.candidates - 1) if self.options.method == "mbr" else self.candidates

    def work(self, lines: int) -> int:
        """What reranking `lines` lines may cost, in the units of decoding work (CHRF_WORK, COMET_WORK a scoring)."""
        return lines * self.scorings() * (COMET_WORK if self.scorer is not None else CHRF_WORK)

    def describe_work(self, lines: int) -> str:
        """`work(lines)` in words, for a refusal: "133056 of reranking (33 sentences x 4032 chrF scorings)"."""
        kind = f"COMET scorings of {COMET_WORK}" if self.scorer is not None else "chrF scorings"
        return f"{self.work(lines)} of reranking ({lines} sentences x {self.scorings()} {kind})"

    def choose(
        self, sources: Sequence[str], candidates: list[list[Translation]], *, stop: Callable[[], bool] | None = None
    ) -> list[list[Translation]]:
        """Each line's candidates with the chosen one first, the others in the search's order.

        stop: asked between chunks of the scorings; once it says True, `RerankStopped` (None: scored in one call).
        """
        pools = [Counter(translation.text for translation in line) for line in candidates]
        if self.options.method == "qe":
            values = self.qe_values(sources, pools, stop=stop)
        else:
            values = self.mbr_values(sources, pools, stop=stop)
        chosen = []
        for line, pool, found in zip(candidates, pools, values, strict=True):
            best = list(pool)[max(range(len(found)), key=lambda n: (found[n], -n))] if found else None
            chosen.append(sorted(line, key=lambda translation: translation.text != best))  # stable: the rest keep order
        return chosen

    def qe_values(
        self, sources: Sequence[str], pools: list[Counter[str]], *, stop: Callable[[], bool] | None = None
    ) -> list[list[float]]:
        """Each line's distinct candidates' COMET-QE scores, one batched call for all lines (none for a line of one)."""
        scorer = self.scorer
        assert scorer is not None
        asked = [(n, text) for n, pool in enumerate(pools) if len(pool) > 1 for text in pool]

        def score(chunk: list[tuple[int, str]]) -> list[float]:
            return scorer.score([sources[n] for n, _ in chunk], [text for _, text in chunk])

        scores = iter(_scored(score, asked, size=scorer.options.batch_size, stop=stop))
        return [[next(scores) for _ in pool] if len(pool) > 1 else [0.0] * len(pool) for pool in pools]

    def mbr_values(
        self, sources: Sequence[str], pools: list[Counter[str]], *, stop: Callable[[], bool] | None = None
    ) -> list[list[float]]:
        """Each line's distinct candidates' expected utility (`expected_utilities`), the utilities of all lines in
        one call."""
        pairs = [mbr_pairs(list(pool.values())) if len(pool) > 1 else [] for pool in pools]
        triples = [(sources[n], list(pool)[a], list(pool)[b]) for n, pool in enumerate(pools) for a, b in pairs[n]]
        size = self.scorer.options.batch_size if self.scorer is not None else CHRF_CHUNK
        found = iter(_scored(self.utilities, triples, size=size, stop=stop))
        values = []
        for pool, needed in zip(pools, pairs, strict=True):
            utility = {pair: next(found) for pair in needed}
            values.append(expected_utilities(list(pool.values()), utility) if needed else [0.0] * len(pool))
        return values

    def utilities(self, triples: list[Triple]) -> list[float]:
        """The utility of each hypothesis against its reference: sentence chrF, or COMET (which reads the source)."""
        if self.scorer is not None:
            return self.scorer.score(
                [s for s, _, _ in triples], [h for _, h, _ in triples], references=[r for _, _, r in triples]
            )
        metric = METRICS["chrf"].scorer()  # chrF2, as `mtkit evaluate` reports it
        return [float(metric.sentence_score(hypothesis, [reference]).score) for _, hypothesis, reference in triples]


def _scored(
    score: Callable[[list[Item]], list[float]], items: list[Item], *, size: int, stop: Callable[[], bool] | None
) -> list[float]:
    """`score(items)`, in chunks of `size` with a look at `stop` before each (`RerankStopped` once it is True); in one
    call without `stop`."""
    if stop is None:
        return score(items)
    found: list[float] = []
    for start in range(0, len(items), size):
        if stop():
            raise RerankStopped
        found += score(items[start : start + size])
    return found


def mbr_pairs(counts: Sequence[int]) -> list[tuple[int, int]]:
    """The (hypothesis, reference) pairs of distinct candidates that MBR scores: every ordered pair of two, and a
    candidate against itself where it was found more than once."""
    return [(a, b) for a in range(len(counts)) for b in range(len(counts)) if a != b or counts[a] > 1]


def expected_utilities(counts: Sequence[int], utility: dict[tuple[int, int], float]) -> list[float]:
    """Each distinct candidate's mean utility against the other candidates, the N - 1 of them counted as found
    (`counts[b]` copies of candidate b; a candidate's own copies less itself)."""
    others = sum(counts) - 1
    if others == 0:
        return [0.0] * len(counts)
    return [
        sum((count - (a == b)) * utility[(a, b)] for b, count in enumerate(counts) if count - (a == b)) / others
        for a in range(len(counts))
    ]


def _check_options(options: RerankOptions, nbest: int) -> None:
    """The options of a reranking, checked before any model is loaded."""
    if options.candidates is None or options.candidates < 2:
        given = "" if options.candidates is None else f" {options.candidates}"
        raise OptionError(
            "rerank",
            "{rerank} {method} chooses among candidates: give {candidates} N of 2 or more, such as {candidates} 8"
            + (f" (not{given})" if given else ""),
            method=options.method,
        )
    if nbest > 1:
        raise OptionError("nbest", "{nbest} {value} with {rerank}: reranking returns one translation; leave {nbest} out",
                          value=nbest)  # fmt: skip
    if options.method == "qe":
        if options.comet is None:
            raise OptionError(
                "rerank", "{rerank} qe needs {comet_model} M, a reference-free COMET model such as Unbabel/wmt22-cometkiwi-da"
            )
        if options.utility is not None:
            raise OptionError("mbr_utility", "{mbr_utility} is the utility of {rerank} mbr: with {rerank} qe leave it out")
    elif options.utility == "comet" and options.comet is None:
        raise OptionError("mbr_utility", "{mbr_utility} comet needs {comet_model} M, such as Unbabel/wmt22-comet-da")
    elif options.utility != "comet" and options.comet is not None:
        raise OptionError(
            "comet_model", "{comet_model} with {rerank} mbr: chrF needs no model; add {mbr_utility} comet, or leave it out"
        )


def _check_unused(options: RerankOptions) -> None:
    """The reranking options given without `--rerank`: each is one line."""
    for option, given in (("candidates", options.candidates), ("mbr_utility", options.utility),
                          ("comet_model", options.comet and options.comet.model)):  # fmt: skip
        if given is not None:
            raise OptionError(
                option, "{" + option + "} {value} without {rerank}: it is read by {rerank} qe or mbr; add one", value=given
            )
