"""`mtkit evaluate` as one library call: the systems (hypothesis files, or models that translate a
split or a source file first), their scores, their problem flags, and paired significance tests.

One system is scored alone; several (`--hyp A --hyp B`, or `-m A -m B --compare`) are each scored
and compared with the first (`mtkit.evaluation.significance`). Several `-m` without `--compare` are
one ensemble. `evaluate` writes nothing but `--output` and `--flags`; the `evaluate` command then
records a run directory's split scores in its `scores.json` (`save_scores`, `mtkit serve`'s /info).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mtkit.config import Config, bleu_band
from mtkit.data.corpora import iter_split
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.evaluation.metrics import EvalResult, score_corpus
from mtkit.evaluation.problems import FlagRules, flag_corpus, flag_counts, write_flags
from mtkit.evaluation.significance import Comparison, compare_systems
from mtkit.textio import read_lines, write_file, write_lines

SCORES_FILE = "scores.json"  # a model directory's recorded test/valid scores


@dataclass
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
    seed: int = 12345
    bootstrap_samples: int = 1000
    randomisation_trials: int = 10000


@dataclass
class SystemReport:
    name: str
    result: EvalResult
    flags: dict[str, int]

    def to_dict(self) -> dict:
        return {**self.result.to_dict(), "flags": self.flags}

    def format(self) -> str:
        problems = ", ".join(f"{flag} {count}" for flag, count in self.flags.items())
        return f"{self.result.format()}\nproblems: {problems} (of {self.result.num_sentences} sentences)"


@dataclass
class Report:
    systems: list[SystemReport]
    comparison: Comparison | None = None
    band: str | None = None  # whether the test BLEU is inside the recipe's expected band

    def to_dict(self) -> dict:
        if len(self.systems) == 1:
            return {**self.systems[0].to_dict(), **({"band": self.band} if self.band else {})}
        comparison = self.comparison.to_dict() if self.comparison else None
        return {"systems": [{"name": s.name, **s.to_dict()} for s in self.systems], "comparison": comparison}

    def format(self) -> str:
        if len(self.systems) == 1:
            return self.systems[0].format() + (f"\n{self.band}" if self.band else "")
        blocks = [f"== {system.name}\n{system.format()}" for system in self.systems]
        return "\n".join(blocks + ([self.comparison.format()] if self.comparison else []))


def evaluate(request: EvaluateRequest) -> Report:
    """Score every system, flag its problems, and compare several with the first."""
    systems = _systems(request)
    names, hypotheses, sources, references = systems.names, systems.hypotheses, systems.sources, systems.references
    reports, all_flags = [], []
    for name, hyps in zip(names, hypotheses, strict=True):
        flags = flag_corpus(hyps, references[0], sources, request.rules)
        reports.append(SystemReport(name, score_corpus(hyps, references), flag_counts(flags)))
        all_flags.append(flags)
    if request.flags_file is not None:
        write_flags(request.flags_file, names, all_flags, sources, hypotheses, references[0])
    comparison = None
    if len(names) > 1:
        comparison = compare_systems(
            names, hypotheses, references, request.seed, request.bootstrap_samples, request.randomisation_trials
        )
    band = bleu_band(systems.recipe) if systems.recipe is not None and request.split == "test" and len(names) == 1 else None
    return Report(reports, comparison, _band_verdict(reports[0].result, band) if band else None)


def _band_verdict(result: EvalResult, band: tuple[float, float]) -> str:
    """Whether the test BLEU is inside the recipe's `expected_test_bleu` band."""
    bleu, (low, high) = round(result.scores[0].score, 2), band  # as printed
    where = "inside" if low <= bleu <= high else ("below" if bleu < low else "above")
    return f"test BLEU {bleu:.2f} is {where} the recipe's expected band {low:g}-{high:g}"


@dataclass
class _Systems:
    """The systems to score: names, hypotheses, the sources (None: unknown), the reference streams,
    and the (first) model's recipe when they come from models."""

    names: list[str]
    hypotheses: list[list[str]]
    sources: list[str] | None
    references: list[list[str]]
    recipe: Config | None = None


def _systems(request: EvaluateRequest) -> _Systems:
    """The systems of hypothesis files, or of models that translate first."""
    if request.hyps:
        if request.models:
            raise MtkitError("evaluate takes --hyp FILE (translations) or -m RUN (a model to translate with), not both")
        if not request.refs:
            raise MtkitError("evaluate --hyp needs at least one --ref FILE to score against")
        sources = read_lines(request.src) if request.src is not None else None
        references = [read_lines(r) for r in request.refs]
        return _Systems([str(h) for h in request.hyps], [read_lines(h) for h in request.hyps], sources, references)
    if not request.models:
        raise MtkitError("evaluate needs --hyp FILE --ref FILE, or -m RUN_DIR with --split test (or --src FILE --ref FILE)")
    return _translated(request)


def _translated(request: EvaluateRequest) -> _Systems:
    """Translate the split or source file with each model (--compare) or with their ensemble."""

    groups = [[model] for model in request.models] if request.compare else [request.models]
    if request.output is not None and len(groups) > 1:
        raise MtkitError("--output writes one system's translations; leave it out with --compare")
    names, hypotheses, sources, references, recipe = [], [], None, None, None
    for group in groups:
        translator = Translator.load(group, device=request.device)  # a CTranslate2 export carries its recipe too
        if sources is None:
            sources, references = _sources_and_references(translator.config, group[0], request)
            recipe = translator.config
        names.append(" + ".join(str(model) for model in group))
        hypotheses.append(translator.translate(sources, beam=request.beam, progress=True))
    if request.output is not None:
        write_lines(hypotheses[0], request.output)
    assert sources is not None and references is not None
    return _Systems(names, hypotheses, sources, references, recipe)


def _sources_and_references(config, model: Path, request: EvaluateRequest) -> tuple[list[str], list[list[str]]]:  # noqa: ANN001
    refs = [read_lines(ref) for ref in request.refs]
    if request.src is not None:
        if not refs:
            raise MtkitError("evaluate --src needs at least one --ref FILE to score against")
        return read_lines(request.src), refs
    if request.split not in ("valid", "test"):
        raise MtkitError("evaluate -m RUN_DIR needs --split test (or valid), or --src FILE --ref FILE")

    split_config = getattr(config.data, request.split)
    if split_config is None:
        raise MtkitError(f"{model}: the recipe has no data.{request.split}; use --src FILE --ref FILE instead")
    pairs = list(iter_split(split_config, config.src_lang, config.tgt_lang, config.data.normalize))
    return [s for s, _ in pairs], [[t for _, t in pairs], *refs]


def scores_directory(request: EvaluateRequest) -> Path | None:
    """The run directory whose scores.json records this evaluation: one model scored on its recipe's split."""
    if request.split is not None and request.src is None and len(request.models) == 1 and request.models[0].is_dir():
        return request.models[0]
    return None


def save_scores(directory: Path, split: str, result: EvalResult) -> Path:
    """Record a split's scores in `directory/scores.json` (what `mtkit serve`'s /info reports); returns its path.

    A directory that cannot be written is an error that says how to evaluate without recording.
    """
    known = known_scores(directory) or {}
    known[split] = {score.name: round(score.score, 2) for score in result.scores}
    try:
        write_file(directory / SCORES_FILE, json.dumps(known, indent=1) + "\n")
    except MtkitError as err:
        raise MtkitError(f"{err}; the scores above are complete: add --no-save-scores to skip recording them") from None
    return directory / SCORES_FILE


def known_scores(path: Path | str) -> dict | None:
    """The scores `mtkit evaluate -m DIR --split ...` recorded for a model directory, if any."""
    scores = Path(path) / SCORES_FILE
    try:
        return json.loads(scores.read_text(encoding="utf-8")) if scores.is_file() else None
    except (OSError, ValueError):
        return None
