"""Text in, text out: one pipeline over any translation engine, for `translate`, `evaluate`,
validation and the Python API.

    from mtkit import Translator
    Translator.load("runs/multi30k_transformer").translate(["Ein Hund läuft."])

The pipeline is written once (`Translator`): clean each line as the model reads it, cut over-long
lines into segments, sort the segments into length batches of a token budget, let the engine
search each batch, detokenise, and put segments and lines back in input order. An `Engine` only
searches a batch of source ids and declares what else it can do (`Capability`); `Translator.load`
picks the engine for a path. A feature an engine lacks is one clear error (`Translator.require`).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from tqdm import tqdm

from mtkit.config import Config, DecodeConfig
from mtkit.data.tokenizer import TokenizerPair, tagged
from mtkit.decoding.alignment import source_word_alignment, word_alignment
from mtkit.decoding.ct2_engine import is_ctranslate2_export, load_export
from mtkit.decoding.engine import (
    Capability,
    Engine,
    LoadedModel,
    PyTorchEngine,
    SourceBatch,
    length_batches,
    output_cap,
    require,
    shortlist_choice,
)
from mtkit.decoding.languages import Languages
from mtkit.decoding.line_parts import LineParts, Splitter, joined
from mtkit.decoding.options import Decoding
from mtkit.decoding.pair_scores import PairScore, score_pairs
from mtkit.decoding.search import NEVER_EMITTED, Hypothesis, SearchOptions, SearchStopped, Stop
from mtkit.decoding.shortlist import load_run_shortlist
from mtkit.decoding.terminology.constrained import Phrases, TermRequest
from mtkit.decoding.terminology.terms import Term, as_terms, encode_term, place_terms, word_continuations
from mtkit.errors import MtkitError, OptionError
from mtkit.models.checkpoint import load_model
from mtkit.models.ensemble import Ensemble, check_same_vocabularies
from mtkit.models.packed import pack_linears
from mtkit.options import EngineName
from mtkit.run_files import RunFiles
from mtkit.runtime import fast_paths_enabled, resolve_device, retain_freed_memory
from mtkit.textio import model_text

LineConstraints = Sequence[str | Sequence[str] | Term]  # one line's constraints
TermLists = Sequence[LineConstraints] | None  # per line: the terms each translation must contain
ModelPaths = Path | str | Sequence[Path | str]  # one model, or several for an ensemble


@dataclass(kw_only=True)
class Translation:
    text: str
    score: float
    tokens: list[int]
    links: list[int] | None = None  # per token, the line's source token it attends to most (--alignments)
    alignment: list[tuple[int, int]] | None = None  # (source word, target word) pairs, 0-based (--alignments)
    source_links: list[int] | None = None  # per source token, the output token that attends to it most (--alignments)
    source_alignment: list[tuple[int, int]] | None = None  # the pairs of `source_links`: what places inline tags
    unmet: list[str] = field(default_factory=list)  # constraints it lacks: the output cap came first


class Translator:
    """An engine with its tokenizers, text normalisation and decoding defaults: lines in, lines out."""

    def __init__(
        self,
        engine: Engine,
        tokenizers: TokenizerPair,
        *,
        decode: DecodeConfig,
        normalize: str = "NFC",
        config: Config | None = None,
        directory: Path | None = None,
    ) -> None:
        self.engine, self.tokenizers, self.decode, self.normalize = engine, tokenizers, decode, normalize
        self.config = config  # the training recipe, when loaded from a run or an export
        self.directory = directory  # the run or export directory it was loaded from, if any
        self.languages = Languages(config, tokenizers)

    @classmethod
    def load(
        cls, path: ModelPaths, engine: EngineName | str = EngineName.AUTO, *, device: str = "auto", fast_paths: bool = False
    ) -> Translator:
        """A run directory (its best.pt, else last.pt), a checkpoint file, or an `mtkit export` directory.

        Several paths make an ensemble (PyTorch engine): the models' next-token log-probabilities are
        averaged at every step, and the first model's tokenizers, recipe and decoding defaults are used.
        fast_paths: keep freed memory in the process (glibc, process-wide) and pack the loaded model's large linears
        (`runtime.fast_paths_enabled`; MTKIT_FAST_PATHS=0 wins); without them nothing outside the loaded model changes.
        """
        paths, engine = [Path(p) for p in ([path] if isinstance(path, (str, Path)) else path)], EngineName(engine)
        exported = [p for p in paths if is_ctranslate2_export(p)]
        if len(paths) > 1 and (exported or engine is EngineName.CTRANSLATE2):
            raise MtkitError(
                f"{(exported or paths)[0]}: ensembles need the PyTorch engine; give each model's run directory "
                "(not an export) with -m, and leave out --engine ctranslate2"
            )
        if engine is EngineName.CTRANSLATE2 or (engine is EngineName.AUTO and exported):
            return cls.over(load_export(paths[0], device=device))
        if exported:
            path = paths[0]
            raise MtkitError(f"{path}: a CTranslate2 export has no PyTorch checkpoint; use --engine ctranslate2 or -m RUN_DIR")
        return cls.over(_load_checkpoints(paths, device, fast_paths))

    @classmethod
    def over(cls, loaded: LoadedModel) -> Translator:
        """A translator over a loaded engine (`ct2_engine.load_export`, or checkpoints)."""
        return cls(loaded.engine, loaded.tokenizers, decode=loaded.decode, normalize=loaded.normalize, config=loaded.config,
                   directory=loaded.directory)  # fmt: skip

    def require(self, capability: Capability, option: str) -> None:
        """One clear error when `option` needs a capability this engine lacks."""
        require(self.engine, capability, option=option)

    def translate(
        self,
        lines: Sequence[str],
        beam: int | None = None,
        *,
        progress: bool = False,
        constraints: TermLists = None,
        tgt_lang: str | None = None,
        src_lang: str | None = None,
        shortlist: bool | None = None,
    ) -> list[str]:
        """One output line per input line, in order; empty inputs give empty outputs.

        constraints: per line, phrases (or lists of alternative phrases) its translation must contain.
        tgt_lang: the language to translate into, for a model of several (`target_languages`); src_lang: the source's
        language, for a model with language codes; shortlist: search over the model's vocabulary shortlist (None:
        when it has one).
        """
        decoding = Decoding(beam=beam, tgt_lang=tgt_lang, src_lang=src_lang, shortlist=shortlist)
        best = self.translate_nbest(lines, decoding, progress=progress, constraints=constraints)
        return [translations[0].text for translations in best]

    def translate_nbest(
        self,
        lines: Sequence[str],
        decoding: Decoding | None = None,
        *,
        prefixes: Sequence[str] | None = None,
        progress: bool = False,
        stop: Stop | None = None,
        constraints: TermLists = None,
        splitter: Splitter | None = None,
    ) -> list[list[Translation]]:
        """The `decoding.nbest` best translations (or samples) of each line, best first, in input order.

        prefixes: one per line (an empty string for none); each translation starts with its prefix.
        stop: asked before every batch and (PyTorch engine) every decoding step; True ends the work
        with `SearchStopped`.
        constraints: per line, phrases (or lists of alternative phrases, or `Term`s) each translation
        must contain (beam search; a translation cut by the output cap lists what it lacks in `unmet`).
        splitter: cuts each line into its sentences, translated one by one and joined by the line's spacing.
        """
        plan = self.plan(lines, decoding, prefixes=prefixes, constraints=constraints, splitter=splitter)
        if stop is not None:
            plan.options = dataclasses.replace(plan.options, stop=stop)
        return self.search(plan, progress=progress)

    def search(self, plan: Plan, *, progress: bool = False) -> list[list[Translation]]:
        """Let the engine search each batch of `plan`; the translations of its lines, in input order."""
        bar = tqdm(total=len(plan.sources), unit=" sent", disable=None if progress else True, file=sys.stderr)
        for batch in plan.batches():
            if plan.options.stop is not None and plan.options.stop():
                raise SearchStopped
            plan.put(batch, self.engine.search(batch, plan.options))
            bar.update(len(batch.sources))
        bar.close()
        return plan.results()

    def score(
        self, sources: Sequence[str], targets: Sequence[str], *, tgt_lang: str | None = None, src_lang: str | None = None
    ) -> list[PairScore]:
        """The model's log-probability of each target (in `tgt_lang`, for a model of several) given its source
        (in `src_lang`, for a model with language codes)."""
        tag, lead = self.leads(Decoding(tgt_lang=tgt_lang, src_lang=src_lang))
        return score_pairs(self.engine, tokenizers=self.tokenizers, normalize=self.normalize, tag=tag, target_lead=lead,
                           batch_tokens=self.decode.batch_beam_tokens, sources=sources, targets=targets)  # fmt: skip

    @property
    def target_languages(self) -> list[str]:
        """The languages this model writes (`Languages.targets`)."""
        return self.languages.targets

    @property
    def tagged(self) -> bool:
        """Whether every source starts with a target-language tag."""
        return self.languages.tagged

    def language_tag(self, tgt_lang: str | None) -> int | None:
        """What a source starts with to be translated into `tgt_lang` (`Languages.tag`), checked."""
        return self.languages.tag(tgt_lang)

    def leads(self, decoding: Decoding) -> tuple[int | None, list[int]]:
        """What a source and its translation start with, for `decoding`'s languages (`Languages.leads`), checked."""
        return self.languages.leads(decoding.src_lang, decoding.tgt_lang)

    def plan(
        self,
        lines: Sequence[str],
        decoding: Decoding | None = None,
        *,
        prefixes: Sequence[str] | None = None,
        constraints: TermLists = None,
        splitter: Splitter | None = None,
    ) -> Plan:
        """The way of `lines` (each cut by `splitter`, if any) through the engine; see `Plan`."""
        options = self.search_options(decoding or Decoding())
        terms = self.line_terms(lines, constraints, options=options) if constraints is not None else None
        if prefixes is not None and len(prefixes) != len(lines):
            raise MtkitError(f"{len(prefixes)} prefixes for {len(lines)} lines: give one prefix per line (empty for none)")
        prefix_ids = None
        if prefixes is not None and any(prefixes):
            self.require(Capability.PREFIX, "prefix")
            prefix_ids = [self.target_prefix(prefix) for prefix in prefixes]
        tag, lead = self.leads(decoding or Decoding())
        if lead:
            self.require(Capability.PREFIX, "tgt_lang")
        carry = tagged([[]], tag)[0]  # what an empty line with a prefix or terms is searched as
        empty = [carry if (prefix_ids and prefix_ids[n]) or (terms and terms[n]) else None for n in range(len(lines))]
        found = LineSegments.of_lines(lines, splitter, encode=functools.partial(self.segments, tag=tag), empty=empty)
        return Plan(found, prefix_ids, options=options, translator=self, terms_of_line=terms, lead=lead)

    def line_terms(
        self, lines: Sequence[str], constraints: Sequence[LineConstraints], *, options: SearchOptions
    ) -> list[list[Term]]:
        """Each line's constraints as `Term`s, checked against the lines and the search."""
        if len(constraints) != len(lines):
            counts = f"constraints for {len(constraints)} lines, but {len(lines)} lines"
            raise MtkitError(f"{counts}: give one list per line ([] for none)")
        # A term given twice (or by two glossary entries) is one constraint: one occurrence meets both.
        given = [as_terms(items, f"line {n + 1}") for n, items in enumerate(constraints)]
        terms = [list({term.alternatives: term for term in line}.values()) for line in given]
        if any(terms):
            self.require(Capability.CONSTRAINTS, "constraints")
            if options.sampling is not None or options.beam < 2:
                used = "{sampling}" if options.sampling is not None else "greedy search (beam 1)"
                template = "{constraints} need beam search, not " + used + ": give {beam} 2 or more, such as {beam} 5"
                raise OptionError("constraints", template)
        return terms

    def encoded_term(self, term: Term) -> Phrases:
        """The target ids of each alternative of `term` (an error names the term's line)."""
        return encode_term(term, self.tokenizers.tgt, normalize=self.normalize, most_pieces=self.engine.max_positions - 2)

    def word_continuations(self) -> tuple[bool, ...]:
        if not hasattr(self, "_continuations"):
            self._continuations = word_continuations(self.tokenizers.tgt)
        return self._continuations

    def search_options(self, decoding: Decoding) -> SearchOptions:
        """The engine's options for `decoding`, checked against what the engine can do."""
        if decoding.sampling is not None:
            self.require(Capability.SAMPLING, "sampling")
            if decoding.beam not in (None, 1):
                raise OptionError(
                    "beam",
                    "{beam} {value} with {sampling}: sampling draws one token at a time; leave {beam} out",
                    value=decoding.beam,
                )
        beam = 1 if decoding.sampling is not None else decoding.beam or self.decode.beam
        nbest = decoding.nbest if decoding.sampling is not None else min(decoding.nbest, beam)
        if nbest > 1:
            self.require(Capability.NBEST, "nbest")
        if decoding.no_repeat_ngram < 0:
            raise OptionError(
                "no_repeat_ngram",
                "{no_repeat_ngram} {value}: give an n-gram size >= 1, such as 3 (0: off)",
                value=decoding.no_repeat_ngram,
            )
        if decoding.no_repeat_ngram:
            self.require(Capability.NO_REPEAT_NGRAM, "no_repeat_ngram")
        if decoding.alignments:
            self.require(Capability.ALIGNMENTS, "alignments")
            self.engine.check_alignment_layer(decoding.alignment_layer)
        penalty = self.decode.length_penalty if decoding.length_penalty is None else decoding.length_penalty
        layer = decoding.alignment_layer if decoding.alignments else None
        in_order = decoding.constraints_in_order
        ngram = decoding.no_repeat_ngram
        shortlist = shortlist_choice(self.engine, asked=decoding.shortlist)
        never = (*NEVER_EMITTED, *(index for index in self.tokenizers.tgt.reserved_ids if index not in NEVER_EMITTED))
        return SearchOptions(
            beam=beam, nbest=nbest, length_penalty=penalty, sampling=decoding.sampling, no_repeat_ngram=ngram,
            alignment_layer=layer, constraints_in_order=in_order, never=never, forced_lead=int(self.languages.coded),
            shortlist=shortlist,
        )  # fmt: skip

    def target_prefix(self, prefix: str) -> list[int]:
        """Target ids a translation must start with; a prefix longer than the model allows is an error."""
        ids = self.tokenizers.tgt.encode(model_text(prefix, self.normalize)) if prefix else []
        if len(ids) >= self.engine.max_positions - 1:
            raise MtkitError(
                f"prefix {prefix[:40]!r}...: {len(ids)} pieces, more than the model's {self.engine.max_positions - 2}; shorten it"
            )
        return ids

    def segments(self, line: str, tag: int | None = None) -> list[list[int]]:
        """Source ids (EOS not included) of a line: none if empty, several if over-long; each after `tag`, if any."""
        text = model_text(line, self.normalize)
        if not text:
            return []
        ids = self.tokenizers.src.encode(text)
        limit = min(self.decode.max_input_tokens, self.engine.max_positions - 1) - (tag is not None)  # room for EOS, tag
        if len(ids) <= limit:
            return tagged([ids], tag)
        cuts = split_points(self.tokenizers.src.id_to_piece(ids), max(limit, 1))
        return tagged([ids[start:end] for start, end in pairwise(cuts)], tag)


@dataclass(frozen=True, kw_only=True)
class LineSegments:
    """A line's source ids in the segments the engine searches (none if empty; several for a line cut into
    sentences, or longer than decode.max_input_tokens), and the text its segments' translations are joined by."""

    segments: list[list[int]]
    between: list[str] = field(default_factory=list)  # len(segments) - 1: a sentence's spacing, " " in a cut part
    overlong: bool = False  # a part was longer than decode.max_input_tokens and cut
    parts: int = 1  # the parts (sentences) the line was cut into

    @classmethod
    def of(cls, parts: LineParts, encode: Callable[[str], list[list[int]]]) -> LineSegments:
        """The segments of a line's parts (`encode` gives a part's: several for an over-long one), one after another,
        and the spacing their translations are joined by."""
        found: list[list[int]] = []
        between: list[str] = []
        space, overlong = "", False
        for part, after in zip(parts.parts, parts.spaces[1:], strict=True):
            pieces = encode(part)
            if pieces:
                between += [space] if found else []
                between += [" "] * (len(pieces) - 1)  # a part longer than decode.max_input_tokens, cut
                found += pieces
                space, overlong = "", overlong or len(pieces) > 1
            space += after
        return cls(segments=found, between=between, overlong=overlong, parts=len(parts.parts))

    @classmethod
    def of_lines(
        cls,
        lines: Sequence[str],
        splitter: Splitter | None,
        *,
        encode: Callable[[str], list[list[int]]],
        empty: list[list[int] | None],
    ) -> list[LineSegments]:
        """Each line cut by `splitter` (else whole) and its parts encoded; an empty line with `empty` ids (its tag, if any:
        a prefix or terms to carry) gets them as its one segment."""
        found = [cls.of(splitter.cut(line) if splitter is not None else LineParts.whole(line), encode) for line in lines]
        return [
            cls(segments=[ids]) if ids is not None and not line.segments else line for line, ids in zip(found, empty, strict=True)
        ]


class Plan:
    """One list of lines on its way through an engine, the pipeline's bookkeeping written once.

    1. `segments_of_line`: the source ids of each line (none if empty, several if cut into sentences or
       over-long); a line's target prefix goes with its first segment (after the target's language code,
       which every segment starts with, for a model with codes), its constraints with the segment they
       belong to (`mtkit.decoding.terminology.terms.place_terms`);
    2. `batches()`: the segments sorted by length into batches of `decode.batch_beam_tokens` x beam;
    3. `put()` records what the engine found for a batch; `results()` detokenises and puts
       segments and lines back together, in input order, each line's segments joined by its own spacing
       (with word alignments, over the whole line, when asked).
    The caller runs the loop: `for batch in plan.batches(): plan.put(batch, engine.search(batch, plan.options))`.
    """

    def __init__(
        self,
        lines: list[LineSegments],
        prefixes_of_line: list[list[int]] | None,
        *,
        options: SearchOptions,
        translator: Translator,
        terms_of_line: list[list[Term]] | None = None,
        lead: Sequence[int] = (),
    ) -> None:
        self.lines = lines
        self.segments_of_line = segments_of_line = [line.segments for line in lines]
        self.sources = [segment for segments in segments_of_line for segment in segments]
        self.prefixes = None
        if prefixes_of_line is not None or lead:
            given = prefixes_of_line or [[] for _ in segments_of_line]
            self.prefixes = [
                [*lead, *(prefix if n == 0 else [])]
                for segments, prefix in zip(segments_of_line, given, strict=True)
                for n in range(len(segments))
            ]
        self.options = options
        self.found: list[list[Translation]] = [[] for _ in self.sources]
        self._translator = translator
        self.terms: list[list[Term]] | None = None  # per segment
        self.term_ids: list[list[Phrases]] = []
        if terms_of_line is not None and any(terms_of_line):
            decode = translator.tokenizers.src.decode
            texts = [[decode(segment) for segment in segments] for segments in segments_of_line]
            self.terms = place_terms(texts, terms_of_line, sentences=[line.parts > 1 for line in lines])
            self.term_ids = [[translator.encoded_term(term) for term in terms] for terms in self.terms]

    @property
    def split_lines(self) -> int:
        """How many of the lines (or of their sentences) are longer than decode.max_input_tokens and translated in
        segments."""
        return sum(line.overlong for line in self.lines)

    @property
    def work(self) -> int:
        """The most decoding steps x rows the search may take: each segment's output cap x the beam (or samples)."""
        return self.options.width * sum(self._cap(index) for index in range(len(self.sources)))

    @property
    def line_work(self) -> list[int]:
        """Each line's share of `work`: its segments' output caps x the beam (or samples)."""
        found, start = [], 0
        for segments in self.segments_of_line:
            found.append(self.options.width * sum(self._cap(index) for index in range(start, start + len(segments))))
            start += len(segments)
        return found

    @property
    def most_steps(self) -> int:
        """The most decoding steps one segment may take: its output cap (or its prefix, if longer)."""
        return max((self._cap(index) for index in range(len(self.sources))), default=0)

    def batches(self) -> Iterator[SourceBatch]:
        batch_tokens = self._translator.decode.batch_beam_tokens
        for indices in length_batches([len(s) for s in self.sources], self.options.width, batch_tokens=batch_tokens):
            prefixes = None if self.prefixes is None else [self.prefixes[i] for i in indices]
            terms = None
            if self.terms is not None:
                continuations, in_order = self._translator.word_continuations(), self.options.constraints_in_order
                terms = TermRequest(
                    constraints=[self.term_ids[i] for i in indices], continues_word=continuations, in_order=in_order
                )
            yield SourceBatch(
                indices=indices,
                sources=[self.sources[i] for i in indices],
                max_len=[self._cap(i) for i in indices],
                prefixes=prefixes,
                terms=terms,
            )

    def _cap(self, index: int) -> int:
        """Most output tokens of segment `index`: the output-length rule, or room for its whole prefix, or
        for all its constraints, if longer."""
        cap = output_cap(
            len(self.sources[index]) + 1, self._translator.decode, max_positions=self._translator.engine.max_positions
        )
        if self.terms is not None:
            terms = self.term_ids[index]  # each term's longest alternative, and a word boundary after it
            pieces = sum(max(len(phrase) for phrase in alternatives) + 1 for alternatives in terms)
            cap = max(cap, min(pieces, self._translator.engine.max_positions - 1))
        return max(cap, len(self.prefixes[index])) if self.prefixes is not None else cap

    def put(self, batch: SourceBatch, hypotheses: list[list[Hypothesis]]) -> None:
        detokenize = self._translator.tokenizers.tgt.decode
        for index, found in zip(batch.indices, hypotheses, strict=True):
            terms = self.terms[index] if self.terms is not None else []
            self.found[index] = [
                Translation(
                    text=detokenize(h.tokens),
                    score=h.score,
                    tokens=h.tokens,
                    links=h.links,
                    source_links=h.source_links,
                    unmet=[terms[j].label for j in h.unmet],
                )
                for h in found
            ]

    def results(self) -> list[list[Translation]]:
        lines = regroup(self.lines, self.found, nbest=self.options.nbest)
        if self.options.alignment_layer is not None:
            tokenizers = self._translator.tokenizers
            for segments, translations in zip(self.segments_of_line, lines, strict=True):
                source_pieces = tokenizers.src.id_to_piece([i for segment in segments for i in segment])
                for translation in translations:
                    target_pieces = tokenizers.tgt.id_to_piece(translation.tokens)
                    translation.alignment = word_alignment(source_pieces, target_pieces, links=translation.links or [])
                    if translation.source_links is not None:
                        translation.source_alignment = source_word_alignment(
                            source_pieces, target_pieces, source_links=translation.source_links
                        )
        return lines


def _load_checkpoints(paths: list[Path], device: str, fast_paths: bool) -> LoadedModel:
    """The PyTorch engine over one model, or over an ensemble of several that share vocabularies
    (`fast_paths`: see `Translator.load`; packing changes only the models built here)."""
    loaded = [load_model(path) for path in paths]
    model, config, tokenizers, _ = loaded[0]
    if len(loaded) > 1:
        check_same_vocabularies(paths, [pair for _, _, pair, _ in loaded])
        model = Ensemble([m for m, _, _, _ in loaded])
    shortlist = load_run_shortlist(paths[0], tokenizers)  # an ensemble's models share the first one's vocabulary
    engine = PyTorchEngine(model.eval(), resolve_device(device), shortlist=shortlist)
    if fast_paths and fast_paths_enabled():  # MTKIT_FAST_PATHS=0: neither, even when asked
        retain_freed_memory()  # each step's (rows x vocabulary) log-probabilities are not page-faulted in again
        pack_linears(engine.model)  # on CPU, large weights laid out once for oneDNN
    return LoadedModel(engine=engine, tokenizers=tokenizers, decode=config.decode, normalize=config.data.normalize, config=config,
                       directory=RunFiles.of(paths[0]).path)  # fmt: skip


def split_points(pieces: Sequence[str], limit: int) -> list[int]:
    """Cut positions [0, ..., len(pieces)] of segments of at most `limit` pieces.

    Each cut falls after the last sentence end (else before the last word start) in the second
    half of its window, else at the window's end.
    """
    cuts = [0]
    while len(pieces) - cuts[-1] > limit:
        start = cuts[-1]
        window = range(start + limit, start + limit // 2, -1)
        cut = next((i for i in window if pieces[i - 1].rstrip().endswith((".", "!", "?", ";"))), None)
        cuts.append(cut or next((i for i in window if pieces[i].startswith("\u2581")), start + limit))
    return [*cuts, len(pieces)]


def regroup(lines: Sequence[LineSegments], found: list[list[Translation]], *, nbest: int) -> list[list[Translation]]:
    """The translations of each line, in input order, from those of its segments (`found`, flat)."""
    results, position = [], 0
    for line in lines:
        count = len(line.segments)
        results.append(_join(found[position : position + count], [len(s) for s in line.segments], line.between, nbest))
        position += count
    return results


def _join(parts: list[list[Translation]], source_lengths: list[int], between: list[str], nbest: int) -> list[Translation]:
    """The k-th translation of a line is its segments' k-th translations (or their best) joined by the line's
    spacing; links point into the line's source tokens (the segments' tokens, one after another)."""
    if not parts:
        return [Translation(text="", score=0.0, tokens=[])] * nbest
    if len(parts) == 1:
        return parts[0]
    offsets = [sum(source_lengths[:n]) for n in range(len(parts))]
    translations = []
    for rank in range(max(len(p) for p in parts)):
        chosen = [p[rank] if rank < len(p) else p[0] for p in parts]
        links = source_links = None
        if all(t.links is not None for t in chosen):
            links = [link + offset for t, offset in zip(chosen, offsets, strict=True) for link in t.links or []]
        if all(t.source_links is not None for t in chosen):  # they point into the joined tokens
            starts = [sum(len(t.tokens) for t in chosen[:n]) for n in range(len(chosen))]
            source_links = [link + start for t, start in zip(chosen, starts, strict=True) for link in t.source_links or []]
        translations.append(
            Translation(
                text=joined([t.text for t in chosen], between),
                score=sum(t.score for t in chosen),
                tokens=[token for t in chosen for token in t.tokens],
                links=links,
                source_links=source_links,
                unmet=[term for t in chosen for term in t.unmet],
            )
        )
    return translations
