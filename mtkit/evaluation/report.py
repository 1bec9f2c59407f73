"""`mtkit evaluate` as one library call: the systems (hypothesis files, or models that translate a
split or a source file first), their scores, their problem flags, and paired significance tests.

One system is scored alone; several (`--hyp A --hyp B`, or `-m A -m B --compare`) are each scored
and compared with the first (`mtkit.evaluation.significance`). Several `-m` without `--compare` are
one ensemble. `evaluate` writes nothing but `--output` and `--flags`; the `evaluate` command then
records a run directory's split scores in its `scores.json` (`save_scores`, `mtkit serve`'s /info).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mtkit.config import Config, bleu_band, direction, split_languages, tag_languages
from mtkit.data.corpora import iter_split
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.documents.formats import DocumentLimits
from mtkit.documents.pipeline import TranslatedDocument, plain_texts, translate_documents
from mtkit.errors import MtkitError, OptionError
from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.comet.scorer import CometScorer
from mtkit.evaluation.language import off_target_rate
from mtkit.evaluation.metrics import METRICS, EvalResult, Score, bleu, chrf, score_corpus
from mtkit.evaluation.problems import FlagRules, flag_corpus, flag_counts, write_flags
from mtkit.evaluation.significance import Comparison, PairedTests, compare_sentence_scores, compare_systems
from mtkit.run_files import RunFiles
from mtkit.textio import read_lines, write_lines


@dataclass(frozen=True, kw_only=True)
class EvaluateRequest:
    """What `mtkit evaluate` was asked for."""

    hyps: list[Path] = field(default_factory=list)
    refs: list[Path] = field(default_factory=list)
    models: list[Path] = field(default_factory=list)
    split: str | None = None  # with models: the recipe's valid or test split
    src: Path | None = None  # with models: the file to translate; with hyps: the sources (for flags)
    beam: int | None = None
    output: Path | None = None  # with one model: also write its translations here
    device: str = "auto"
    compare: bool = False  # several models: compare them (else one ensemble)
    flags_file: Path | None = None
    rules: FlagRules = field(default_factory=FlagRules)
    tests: PairedTests = field(default_factory=PairedTests)  # the paired significance tests' seed and samples
    tgt_lang: str | None = None  # with models: the language to translate into (a model of several)
    src_lang: str | None = None  # with models: the source's language code (an imported NLLB-200, M2M-100 or mBART-50)
    off_target: bool = False  # report the share of outputs not in the target language (py3langid)
    fast_paths: bool = False  # load the models with mtkit's CPU fast paths (`Translator.load`; the CLI asks)
    metric: str | None = None  # "comet" or "qe": also a COMET model's score (its row of METRICS), from `comet`
    comet: CometOptions | None = None  # the COMET model that scores `metric`
    shortlist: bool | None = None  # search over the model's vocabulary shortlist (None: when it has one)
    document_format: str = "text"  # each line a document of this format (documents.formats): scored without its markup


@dataclass(kw_only=True)
class SystemReport:
    name: str
    result: EvalResult
    flags: dict[str, int]
    sentence_scores: dict[str, list[float]] = field(default_factory=dict)  # a COMET score's, sentence by sentence

    def to_dict(self) -> dict:
        sentences = {"sentence_scores": self.sentence_scores} if self.sentence_scores else {}
        return {**self.result.to_dict(), "flags": self.flags, **sentences}

    def format(self) -> str:
        problems = ", ".join(f"{flag} {count}" for flag, count in self.flags.items())
        return f"{self.result.format()}\nproblems: {problems} (of {self.result.num_sentences} sentences)"


@dataclass(kw_only=True)
class DirectionReport:
    """The first system's scores on one direction of a split of several (or with --off-target)."""

    name: str  # "de-en"
    bleu: float
    chrf: float
    sentences: int
    off_target: float | None = None  # percent of outputs not in the target language

    def to_dict(self) -> dict:
        scores = {"bleu": round(self.bleu, 2), "chrf": round(self.chrf, 2), "num_sentences": self.sentences}
        return scores | ({"off_target": round(self.off_target, 2)} if self.off_target is not None else {})

    def format(self) -> str:
        off = f", off-target {self.off_target:.1f}%" if self.off_target is not None else ""
        return f"{self.name}: BLEU {self.bleu:.2f}, chrF {self.chrf:.2f}{off} ({self.sentences} sentences)"


@dataclass(kw_only=True)
class Report:
    systems: list[SystemReport]
    comparison: Comparison | None = None
    band: str | None = None  # whether the test BLEU is inside the recipe's expected band
    directions: list[DirectionReport] = field(default_factory=list)

    def to_dict(self) -> dict:
        directions = {"directions": {d.name: d.to_dict() for d in self.directions}} if self.directions else {}
        if len(self.directions) > 1:
            directions["mean"] = {key: round(value, 2) for key, value in self.mean().items()}
        if len(self.systems) == 1:
            return {**self.systems[0].to_dict(), **({"band": self.band} if self.band else {}), **directions}
        comparison = self.comparison.to_dict() if self.comparison else None
        return {"systems": [{"name": s.name, **s.to_dict()} for s in self.systems], "comparison": comparison, **directions}

    def mean(self) -> dict[str, float]:
        """The directions' mean BLEU and chrF (and off-target rate)."""
        keys = ["bleu", "chrf"] + (["off_target"] if all(d.off_target is not None for d in self.directions) else [])
        return {key: sum(getattr(d, key) for d in self.directions) / len(self.directions) for key in keys}

    def format(self) -> str:
        lines = [d.format() for d in self.directions]
        if len(self.directions) > 1:
            mean = self.mean()
            off = f", off-target {mean['off_target']:.1f}%" if "off_target" in mean else ""
            lines.append(f"mean of {len(self.directions)} directions: BLEU {mean['bleu']:.2f}, chrF {mean['chrf']:.2f}{off}")
        if len(self.systems) == 1:
            return "\n".join([self.systems[0].format(), *([self.band] if self.band else []), *lines])
        blocks = [f"== {system.name}\n{system.format()}" for system in self.systems]
        return "\n".join(blocks + ([self.comparison.format()] if self.comparison else []) + lines)


def evaluate(request: EvaluateRequest) -> Report:
    """Score every system, flag its problems, and compare several with the first.

    Without references (`--hyp H --src S` alone) only a reference-free metric (`--metric qe`) scores.
    """
    _check_inputs(request)
    quality = _quality_scorer(request)  # a COMET model is checked and loaded before anything is translated
    systems = _systems(request)
    names, hypotheses, sources, references = systems.names, systems.hypotheses, systems.sources, systems.references
    first_reference = references[0] if references else None
    reports, all_flags = [], []
    for name, hyps in zip(names, hypotheses, strict=True):
        flags = flag_corpus(hyps, first_reference, sources=sources, rules=request.rules)
        result = score_corpus(hyps, references) if references else EvalResult([], len(hyps))
        reports.append(SystemReport(name=name, result=result, flags=flag_counts(flags)))
        all_flags.append(flags)
    if quality is not None:
        _add_quality_scores(reports, systems, quality, request.metric or "comet")
    if request.flags_file is not None:
        write_flags(
            request.flags_file, names, flags=all_flags, sources=sources, hypotheses=hypotheses, references=first_reference
        )
    comparison = _comparison(reports, systems, request.tests) if len(names) > 1 else None
    band = bleu_band(systems.recipe) if systems.recipe is not None and request.split == "test" and len(names) == 1 else None
    by_direction = bool(references) and (len(systems.directions) > 1 or request.off_target or request.tgt_lang is not None)
    directions = _directions(systems, request) if by_direction else []
    verdict = None
    if band and len(directions) > 1:  # a multilingual recipe's band is for the mean of its directions
        mean = sum(direction.bleu for direction in directions) / len(directions)
        verdict = _band_verdict(mean, band, f"mean test BLEU of {len(directions)} directions")
    elif band:
        verdict = _band_verdict(reports[0].result.score_of("bleu"), band, "test BLEU")
    return Report(systems=reports, comparison=comparison, band=verdict, directions=directions)


def _comparison(reports: list[SystemReport], systems: _Systems, tests: PairedTests) -> Comparison:
    """Each system against the first: sacreBLEU's paired tests (with references), and COMET's over its sentence scores."""
    if systems.references:
        comparison = compare_systems(systems.names, systems.hypotheses, references=systems.references, tests=tests)
    else:
        comparison = Comparison(
            systems=systems.names,
            scores={},
            seed=tests.seed,
            bootstrap_samples=tests.bootstrap_samples,
            randomisation_trials=tests.randomisation_trials,
        )  # no references: COMET-QE's tests alone
    for metric in reports[0].sentence_scores:
        comparison.scores[metric] = compare_sentence_scores([report.sentence_scores[metric] for report in reports], tests)
    return comparison


def _check_inputs(request: EvaluateRequest) -> None:
    """What the metrics need from the files given, checked before a COMET model is loaded or anything translated:
    the sources for COMET, and references for every metric but a reference-free one (`--metric qe`)."""
    if request.metric is not None and request.hyps and request.src is None:
        raise MtkitError(f"--metric {request.metric} reads the sources too: give --src FILE with --hyp")
    from_files = bool(request.hyps) or (bool(request.models) and request.src is not None)  # else the recipe's split
    if request.refs or not from_files:
        return
    if request.metric is None or METRICS[request.metric].needs_references:
        scored = f"--metric {request.metric} scores" if request.metric is not None else "BLEU, chrF and TER score"
        raise MtkitError(
            f"{scored} against references: give --ref FILE (or score from the sources alone with "
            "--metric qe --comet-model M, a reference-free COMET model)"
        )
    if request.off_target:
        raise MtkitError("--off-target is reported beside each direction's BLEU and chrF: give --ref FILE with it")


def _quality_scorer(request: EvaluateRequest) -> CometScorer | None:
    """The COMET model `--metric` asks for, loaded, and checked to be of that kind (with or without references)."""
    if request.metric is None:
        if request.comet is not None:
            raise MtkitError(f"--comet-model {request.comet.model} scores with --metric comet (or qe, reference-free): add it")
        return None
    if request.comet is None:
        raise MtkitError(f"--metric {request.metric} needs --comet-model M: a COMET folder or hub id (docs/evaluation.md)")
    scorer = CometScorer.load(request.comet)
    model = request.comet.model
    if request.metric == "comet" and not scorer.needs_references:
        raise MtkitError(f"--metric comet with --comet-model {model}, a reference-free (QE) model: use --metric qe")
    if request.metric == "qe" and scorer.needs_references:
        raise MtkitError(
            f"--metric qe with --comet-model {model}, which scores against references: use --metric comet, "
            "or a QE model such as Unbabel/wmt22-cometkiwi-da"
        )
    return scorer


def _add_quality_scores(reports: list[SystemReport], systems: _Systems, scorer: CometScorer, metric: str) -> None:
    """Each system's COMET (or COMET-QE) score, the mean of its sentence scores, beside sacreBLEU's."""
    sources, row = systems.sources, METRICS[metric]
    assert sources is not None, "_check_inputs asks --hyp for --src"
    for system, hypotheses in zip(systems.names, systems.hypotheses, strict=True):
        if len(sources) != len(hypotheses):
            raise MtkitError(f"--src has {len(sources)} lines but {system} {len(hypotheses)}; give aligned files")
    references = systems.references[0] if scorer.needs_references else None
    for report, hypotheses in zip(reports, systems.hypotheses, strict=True):
        sentences = scorer.score(sources, hypotheses, references=references, progress=True)
        report.result.scores.append(
            Score(name=row.name, score=sum(sentences) / len(sentences), signature=scorer.signature, digits=row.digits)
        )
        report.sentence_scores[row.name] = sentences


def _band_verdict(bleu: float, band: tuple[float, float], what: str) -> str:
    """Whether the test BLEU is inside the recipe's `expected_test_bleu` band."""
    bleu, (low, high) = round(bleu, 2), band  # as printed
    where = "inside" if low <= bleu <= high else ("below" if bleu < low else "above")
    return f"{what} {bleu:.2f} is {where} the recipe's expected band {low:g}-{high:g}"


def _directions(systems: _Systems, request: EvaluateRequest) -> list[DirectionReport]:
    """The first system's BLEU, chrF (and off-target rate) on each direction."""
    found = []
    candidates = systems.recipe_languages()
    for way in systems.directions:
        hyps, refs = systems.hypotheses[0][way.start : way.end], systems.references[0][way.start : way.end]
        if way.tgt_lang is None and request.off_target:
            raise OptionError("off_target", "{off_target} needs the target language: give {tgt_lang}, such as {tgt_lang} fr")
        off = off_target_rate(hyps, way.tgt_lang, candidates=candidates) if request.off_target and way.tgt_lang else None
        found.append(
            DirectionReport(name=way.name, bleu=bleu(hyps, refs), chrf=chrf(hyps, refs), sentences=len(hyps), off_target=off)
        )
    return found


@dataclass(frozen=True)
class _Direction:
    """Lines start..end of the sources are one direction, translated into `tgt_lang` (None: unknown)."""

    name: str
    tgt_lang: str | None
    start: int
    end: int


@dataclass
class _Systems:
    """The systems to score: names, hypotheses, the sources (None: unknown), the reference streams,
    the (first) model's recipe when they come from models, and the directions of the lines."""

    names: list[str]
    hypotheses: list[list[str]]
    sources: list[str] | None
    references: list[list[str]]
    recipe: Config | None = None
    directions: list[_Direction] = field(default_factory=list)

    def recipe_languages(self) -> list[str]:
        """The recipe's languages: the candidates an output's language is identified among."""
        return tag_languages(self.recipe) if self.recipe is not None else []


def _systems(request: EvaluateRequest) -> _Systems:
    """The systems of hypothesis files, or of models that translate first."""
    if request.hyps:
        if request.models:
            raise MtkitError("evaluate takes --hyp FILE (translations) or -m RUN (a model to translate with), not both")
        sources = _plain(_sentences(request.src, "--src"), request, "--src") if request.src is not None else None
        references = [read_lines(r) for r in request.refs]
        hypotheses = [_plain(_sentences(h, "--hyp"), request, f"--hyp {h}") for h in request.hyps]
        whole = [_Direction(f"into {request.tgt_lang}", request.tgt_lang, 0, len(hypotheses[0]))]
        return _Systems([str(h) for h in request.hyps], hypotheses, sources, references, directions=whole)
    if not request.models:
        raise MtkitError("evaluate needs --hyp FILE --ref FILE, or -m RUN_DIR with --split test (or --src FILE --ref FILE)")
    return _translated(request)


def _sentences(path: Path, option: str) -> list[str]:
    """A file's lines, of which there must be some: an empty file is one line, not a score of nothing."""
    lines = read_lines(path)
    if not lines:
        raise MtkitError(f"{option} {path}: no sentences to score (the file is empty); give one sentence a line")
    return lines


def _translated(request: EvaluateRequest) -> _Systems:
    """Translate the split or source file with each model (--compare) or with their ensemble."""

    groups = [[model] for model in request.models] if request.compare else [request.models]
    if request.output is not None and len(groups) > 1:
        raise MtkitError("--output writes one system's translations; leave it out with --compare")
    names, hypotheses, outputs, sources, references, recipe, directions = [], [], [], None, None, None, []
    for group in groups:
        # a CTranslate2 export carries its recipe too
        translator = Translator.load(group, device=request.device, fast_paths=request.fast_paths)
        if sources is None:
            sources, references, directions = _sources_and_references(translator, group[0], request)
            recipe = translator.config
        names.append(" + ".join(str(model) for model in group))
        translated, written = [], []
        for way in directions:
            lines = sources[way.start : way.end]
            if request.document_format == "text":
                translated += translator.translate(
                    lines,
                    beam=request.beam,
                    progress=True,
                    tgt_lang=way.tgt_lang,
                    src_lang=request.src_lang,
                    shortlist=request.shortlist,
                )
            else:
                documents = _translated_documents(translator, lines, request, tgt_lang=way.tgt_lang)
                translated += [document.text for document in documents]
                written += [document.markup for document in documents]
        hypotheses.append(translated)
        outputs.append(written or translated)
    if request.output is not None:
        write_lines(outputs[0], request.output)
    assert sources is not None and references is not None
    return _Systems(names, hypotheses, _plain(sources, request, "--src"), references, recipe, directions)


def _translated_documents(
    translator: Translator, lines: list[str], request: EvaluateRequest, *, tgt_lang: str | None
) -> list[TranslatedDocument]:
    """Each line, a document of `request.document_format`, translated with its markup put back."""
    decoding = Decoding(beam=request.beam, tgt_lang=tgt_lang, src_lang=request.src_lang, shortlist=request.shortlist)
    limits = DocumentLimits()
    return translate_documents(translator, lines, document_format=request.document_format, decoding=decoding, limits=limits)


def _plain(lines: list[str], request: EvaluateRequest, option: str) -> list[str]:
    """Lines as the metrics read them: a document format's without its markup."""
    if request.document_format == "text":
        return lines
    names = [f"{option} line {number}" for number in range(1, len(lines) + 1)]
    return plain_texts(lines, document_format=request.document_format, names=names, limits=DocumentLimits())


def _sources_and_references(
    translator: Translator, model: Path, request: EvaluateRequest
) -> tuple[list[str], list[list[str]], list[_Direction]]:
    """The lines to translate, their reference streams, and their directions (one, or a split's several)."""
    refs = [read_lines(ref) for ref in request.refs]
    config = translator.config
    if request.src is not None:
        translator.leads(Decoding(src_lang=request.src_lang, tgt_lang=request.tgt_lang))  # checked before translating
        sources = _sentences(request.src, "--src")
        target = request.tgt_lang or (translator.target_languages or [None])[0]
        return sources, refs, [_Direction(f"into {target}", target, 0, len(sources))]
    if request.split not in ("valid", "test"):
        raise MtkitError("evaluate -m RUN_DIR needs --split test (or valid), or --src FILE --ref FILE")
    splits = getattr(config.data, request.split) if config is not None else None
    if splits is None:
        raise MtkitError(f"{model}: the recipe has no data.{request.split}; use --src FILE --ref FILE instead")
    sources, references, directions = [], [], []
    for split in splits:
        if request.tgt_lang is not None and split_languages(config, split)[1] != request.tgt_lang:
            continue  # --tgt-lang with --split: the directions into that language only
        src_lang, tgt_lang = split_languages(config, split)
        pairs = list(iter_split(split, src_lang, tgt_lang=tgt_lang, normalize=config.data.normalize))
        directions.append(_Direction(direction(config, split), tgt_lang, len(sources), len(sources) + len(pairs)))
        sources += [s for s, _ in pairs]
        references += [t for _, t in pairs]
    if not directions:
        raise OptionError(
            "tgt_lang",
            "{tgt_lang} {value}: no direction of data.{split} translates into it",
            value=request.tgt_lang,
            split=request.split,
        )
    if not sources:
        raise MtkitError(f"{model}: the recipe's data.{request.split} has no sentences to score; check its files")
    return sources, [references, *refs], directions


def scores_directory(request: EvaluateRequest) -> Path | None:
    """The run directory whose scores.json records this evaluation: one model scored on its recipe's split."""
    if request.split is not None and request.src is None and len(request.models) == 1 and request.models[0].is_dir():
        return request.models[0]
    return None


def save_scores(directory: Path, split: str, *, result: EvalResult) -> Path:
    """Record a split's scores in `directory/scores.json` (what `mtkit serve`'s /info reports); returns its path.

    A directory that cannot be written is an error that says how to evaluate without recording.
    """
    files = RunFiles(directory)
    known = files.read_scores() or {}
    known[split] = {score.name: round(score.score, score.digits) for score in result.scores}
    known[split]["signatures"] = {score.name: score.signature for score in result.scores}  # a model card quotes them
    try:
        files.write_scores(known)
    except MtkitError as err:
        raise MtkitError(f"{err}; the scores above are complete: add --no-save-scores to skip recording them") from None
    return files.scores
