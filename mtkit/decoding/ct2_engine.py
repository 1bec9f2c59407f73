"""Translating with a CTranslate2 export (`mtkit export`): the `ctranslate2` engine of `mtkit.decoding.translator`.

    from mtkit import Translator
    Translator.load("exports/multi30k_int8").translate(["Ein Hund läuft."])

The `Translator` pipeline normalises, splits, batches and caps the inputs exactly as for the PyTorch
engine. CTranslate2's `max_decoding_length` holds for a whole call, so a batch goes in one call at
its largest cap and each hypothesis is cut to its own sentence's cap (exact for greedy search and
sampling); beam search runs a sentence again at its own cap when a hypothesis went past it (see
`CT2Engine.search`). Prefixes, n-gram blocking, sampling and alignments are CTranslate2's own;
scoring is its `score_batch`.

Scores are always mtkit's: the model's log-probability of every output token and the EOS. Where
CTranslate2 scores otherwise (a hypothesis cut at the cap, forced prefix tokens, which it counts as
0, and n-gram blocking, which it renormalises over the tokens left), the hypothesis is scored again
with `score_batch`, and the hypotheses are ranked by that score. As in the PyTorch engine, PAD and
BOS are never emitted: a call whose results hold one is run again with both suppressed (which
CTranslate2 renormalises over the other tokens, so those hypotheses are scored again too).

Where the engines can differ (besides float rounding), all in what beam search or sampling finds,
never in how it is scored: at the cap CTranslate2 does not force EOS, so beam search may keep fewer
(or other) capped hypotheses than mtkit (greedy is unaffected); with length penalty 0 its beam
search also waits for its best beam to finish, where mtkit stops at `beam` finished hypotheses;
right after a prefix it keeps EOS out of all but the best beam; with n-gram blocking its beams are
ranked by the renormalised scores; it does not translate an empty source, so an empty line with a
prefix gives the prefix alone; and its samples come from its own random generator, so a seed draws
other samples than in the PyTorch engine. Alignments come from the last decoder layer only, with
its heads averaged (fixed at export).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

from mtkit.config import config_from_dict
from mtkit.data.tokenizer import EOS_ID, Tokenizer, TokenizerPair, pieces_file
from mtkit.decoding.engine import Capability, Engine, LoadedModel, SourceBatch
from mtkit.decoding.search import Hypothesis, SearchOptions, length_penalty
from mtkit.errors import MtkitError, OptionError, one_line
from mtkit.runtime import cpu_cores

MANIFEST = "mtkit.json"  # what an export holds besides CTranslate2's model (mtkit.exporters.ctranslate2 writes it)
VOCABULARY_MAP = "vmap.txt"  # CTranslate2's vocabulary map: the run's shortlist, where it has one
MAX_MANIFEST_BYTES = 16 << 20  # far above any recipe's; a larger mtkit.json is not one mtkit wrote
# the manifest's keys that loading reads, and their JSON types
MANIFEST_KEYS: dict[str, type] = {"tokenizers": dict, "recipe": dict, "decode": dict, "max_positions": int, "normalize": str}
MANIFEST_KINDS = {dict: "an object", int: "a whole number above 0", str: "a string"}
SIDES = ("src", "tgt")


def import_ctranslate2() -> ModuleType:
    """The ctranslate2 package, or an MtkitError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise MtkitError("the ctranslate2 package is not installed; run `pip install ctranslate2` (4.5 or newer)") from None
    return ctranslate2


def is_ctranslate2_export(path: Path) -> bool:
    """True for a directory written by `mtkit export --format ctranslate2`."""
    return (path / MANIFEST).is_file() and (path / "model.bin").is_file()


@dataclass
class _Candidate:
    """One hypothesis as CTranslate2 found it, on its way to a `Hypothesis`."""

    source: list[str]  # the source pieces, for scoring it again
    pieces: list[str]  # output pieces, without EOS, at most the cap
    log_prob: float | None  # total log-probability, EOS included; None: to be scored again
    links: list[int] | None


class CT2Engine(Engine):
    """A `ctranslate2.Translator` behind the engine interface (Transformer exports, CPU or CUDA).

    `load` makes another `ctranslate2.Translator` over the same export (sampling loads one per
    batch); `alignment_layer` is the decoder layer of the attention CTranslate2 returns, averaged
    over its heads (None: an export made before mtkit asked for that).
    """

    name = "ctranslate2"
    capabilities = frozenset(Capability) - {Capability.ATTENTION, Capability.ENSEMBLE, Capability.CONSTRAINTS}
    alternative = "use the PyTorch engine: mtkit translate -m RUN_DIR (the run directory the export came from)"

    def __init__(
        self,
        model: Any,
        tokenizers: TokenizerPair,
        *,
        max_positions: int,
        batch_tokens: int,
        load: Callable[[], Any],
        alignment_layer: int | None,
        vocabulary_map: bool = False,
    ) -> None:
        self.model = model  # a ctranslate2.Translator
        self.vocabulary_map = vocabulary_map  # the export holds a vocabulary map (`use_vmap` turns it on)
        self.max_positions = max_positions  # rows of the exported position tables
        self.batch_tokens = batch_tokens
        self.alignment_layer = alignment_layer
        self._load = load
        self._source_pieces = tokenizers.src.id_to_piece(range(tokenizers.src.vocab_size))
        self._target_pieces = tokenizers.tgt.id_to_piece(range(tokenizers.tgt.vocab_size))
        self._target_ids = {piece: index for index, piece in enumerate(self._target_pieces)}

    @property
    def has_shortlist(self) -> bool:
        return self.vocabulary_map

    def search(self, batch: SourceBatch, options: SearchOptions) -> list[list[Hypothesis]]:
        """One CTranslate2 call for the whole batch at its largest output cap, each hypothesis cut to its own.

        Cutting is exact for greedy search and sampling: a path does not depend on the cap before it
        reaches it. Beam search keeps a source's result when all its hypotheses ended before the
        source's cap (the search never reached it, so a call at that cap finds the same); the few
        others go again, one call per cap (with length penalty 0, all sources of a smaller cap).
        Calls per cap for every batch would cut CTranslate2's batches into pieces of a few
        sentences (with `max_len_a` > 0 each source length has its cap).
        """
        if not batch.sources:
            return []
        model = self.model if options.sampling is None else self._seeded(options.sampling.seed)
        found, reached = self._call(batch, list(range(len(batch.sources))), options, model)
        if options.beam > 1 and options.sampling is None:
            by_cap: dict[int, list[int]] = {}
            for index in reached:
                by_cap.setdefault(batch.max_len[index], []).append(index)
            for indices in by_cap.values():
                for index, hypotheses in zip(indices, self._call(batch, indices, options, model)[0], strict=True):
                    found[index] = hypotheses
        return found

    def _call(
        self, batch: SourceBatch, indices: list[int], options: SearchOptions, model: Any
    ) -> tuple[list[list[Hypothesis]], list[int]]:
        """The hypotheses of the sources `indices` from one CTranslate2 call at their largest cap, and the
        sources of a smaller cap that a hypothesis went past."""
        caps = [batch.max_len[index] for index in indices]
        sources = [[self._source_pieces[i] for i in batch.sources[index]] for index in indices]
        prefixes = None
        if batch.prefixes is not None:
            prefixes = [[self._target_pieces[i] for i in batch.prefixes[index]] for index in indices]
        top = max(caps)
        results = self._translate(sources, prefixes, top, options, model)
        suppressed = self._emits_never(results, options)  # rare: then again, with those suppressed
        if suppressed:
            results = self._translate(sources, prefixes, top, options, model, suppress=True)
        # With length penalty 0, CTranslate2's beam search goes on until its best beam ends, which may be past a
        # sentence's cap even when every hypothesis it returns is shorter: then every smaller cap goes again.
        every = _search_alpha(options) == 0.0
        reached = [
            index
            for index, cap, result in zip(indices, caps, results, strict=True)
            if cap < top and (every or any(len(pieces) > cap for pieces in result.hypotheses))
        ]
        return self._finish(sources, prefixes, results, caps, options, suppressed), reached

    def _emits_never(self, results: list[Any], options: SearchOptions) -> bool:
        """Whether a hypothesis holds a piece mtkit never emits: PAD, BOS or a target-language tag."""
        never = {self._target_pieces[index] for index in options.never}
        return any(never.intersection(pieces) for result in results for pieces in result.hypotheses)

    def score(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        results = self.model.score_batch(
            [[self._source_pieces[i] for i in source] for source in sources],
            [[self._target_pieces[i] for i in target] for target in targets],
            max_batch_size=self.batch_tokens,
            batch_type="tokens",
            max_input_length=0,  # the pipeline already cut the pairs to the model's positions
        )
        return [list(result.log_probs) for result in results]  # each target token, then EOS (BOS is given)

    def check_alignment_layer(self, layer: int) -> None:
        if self.alignment_layer is None:
            raise OptionError(
                "alignments",
                "{alignments}: this export predates mtkit's alignments; "
                "export it again: mtkit export -m RUN_DIR --format ctranslate2 -o DIR --force",
            )
        if layer not in (-1, self.alignment_layer):
            raise OptionError(
                "alignment_layer",
                "{alignment_layer} {value}: a CTranslate2 export aligns with its last decoder layer only "
                "(-1 or {last}); for another layer use the PyTorch engine: mtkit translate -m RUN_DIR",
                value=layer,
                last=self.alignment_layer,
            )

    def _seeded(self, seed: int) -> Any:
        """A fresh `ctranslate2.Translator` that draws from `seed`.

        CTranslate2 seeds a worker thread's random generator once, at the thread's first draw, and
        `set_random_seed` does not reseed it later; only a new translator (new threads) starts from
        the seed again, so each sampled batch loads one, as the PyTorch engine seeds each batch.
        Its seeds have 32 bits: a 64-bit seed is folded (its two halves xor-ed), so the same seed
        still draws the same samples.
        """
        import_ctranslate2().set_random_seed((seed ^ (seed >> 32)) & 0xFFFFFFFF)
        return self._load()

    def _translate(
        self,
        sources: list[list[str]],
        prefixes: list[list[str]] | None,
        max_len: int,
        options: SearchOptions,
        model: Any,
        suppress: bool = False,
    ) -> list[Any]:
        """CTranslate2's results for source pieces that share the output cap `max_len` (tokens, EOS not counted);
        `suppress`: PAD, BOS and tags are never emitted (CTranslate2 then renormalises over the other tokens)."""
        sampling = options.sampling
        beam = options.beam if sampling is None else 1
        return model.translate_batch(
            sources,
            target_prefix=[prefix or None for prefix in prefixes] if prefixes is not None else None,
            beam_size=beam,
            num_hypotheses=_draws(options),  # with beam search, every finished one, so `_finish` can re-rank them
            length_penalty=_search_alpha(options),
            no_repeat_ngram_size=options.no_repeat_ngram,
            # CTranslate2's top-k 0 is the whole vocabulary too, and 1 its argmax; above the vocabulary it refuses.
            sampling_topk=1 if sampling is None else min(sampling.top_k, len(self._target_pieces)),
            sampling_topp=1.0 if sampling is None else sampling.top_p,
            sampling_temperature=1.0 if sampling is None else sampling.temperature,
            max_input_length=0,  # segments are already cut to the model's positions
            max_decoding_length=max_len + 1,  # max_len tokens (a prefix included), then EOS
            min_decoding_length=0,
            suppress_sequences=[[self._target_pieces[index]] for index in options.never] if suppress else None,
            return_scores=True,
            return_end_token=True,  # the length penalty counts the EOS, as in mtkit
            return_attention=options.alignment_layer is not None,
            use_vmap=options.shortlist and self.vocabulary_map,
            max_batch_size=max(1, self.batch_tokens // options.width),
            batch_type="tokens",
        )

    def _finish(
        self,
        sources: list[list[str]],
        prefixes: list[list[str]] | None,
        results: list[Any],
        caps: list[int],
        options: SearchOptions,
        suppressed: bool = False,
    ) -> list[list[Hypothesis]]:
        """Each source's `nbest` hypotheses (ids without EOS), ranked by mtkit's score.

        CTranslate2 ends a hypothesis that reaches the cap with whatever token comes next; mtkit
        forces EOS after `max_len` tokens. Such hypotheses are cut to `max_len` tokens and scored
        again with that EOS, as are all hypotheses of a prefixed source or of n-gram blocking.
        """
        found = []
        for row, (source, result, max_len) in enumerate(zip(sources, results, caps, strict=True)):
            # CTranslate2 counts forced prefix tokens as 0 and renormalises over the tokens n-gram blocking leaves.
            its_own = bool(prefixes and prefixes[row]) or options.no_repeat_ngram > 0 or suppressed
            attention: list[Any] = [None] * len(result.hypotheses)
            if options.alignment_layer is not None:
                attention = result.attention or [[] for _ in result.hypotheses]  # none for an empty source
            candidates = [
                self._candidate(source, pieces, score, weights, max_len, None if its_own else _search_alpha(options))
                for pieces, score, weights in zip(result.hypotheses, result.scores, attention, strict=True)
            ]
            if options.sampling is None:
                candidates = _distinct(candidates)
            elif len(candidates) < options.nbest:
                candidates = candidates * options.nbest  # top-k 1: the one argmax output is every sample
            found.append(candidates)
        self._score_again([candidate for candidates in found for candidate in candidates if candidate.log_prob is None])
        alpha = _rank_alpha(options)
        ranked = [
            sorted((self._hypothesis(c, alpha) for c in candidates), key=lambda h: h.score, reverse=True) for candidates in found
        ]
        return [hypotheses[: options.nbest] for hypotheses in ranked]

    def _candidate(
        self,
        source: list[str],
        pieces: list[str],
        score: float,
        attention: list[list[float]] | None,
        max_len: int,
        alpha: float | None,
    ) -> _Candidate:
        """A result hypothesis, cut to `max_len`; its log-probability unless it must be scored again
        (capped, or `alpha` None: CTranslate2's score is not the model's log-probability)."""
        ended = bool(pieces) and pieces[-1] == self._target_pieces[EOS_ID] and len(pieces) <= max_len + 1
        kept = pieces[:-1] if ended else pieces[:max_len]
        log_prob = score * length_penalty(len(kept) + 1, alpha) if ended and alpha is not None else None
        links = None if attention is None else _links(attention, len(kept))
        return _Candidate(source, kept, log_prob, links)

    def _score_again(self, candidates: list[_Candidate]) -> None:
        """Set the model's log-probability of each candidate's pieces and EOS."""
        if not candidates:
            return
        results = self.model.score_batch(
            [c.source for c in candidates],
            [c.pieces for c in candidates],
            max_batch_size=self.batch_tokens,
            batch_type="tokens",
            max_input_length=0,
        )
        for candidate, result in zip(candidates, results, strict=True):
            candidate.log_prob = sum(result.log_probs)

    def _hypothesis(self, candidate: _Candidate, alpha: float) -> Hypothesis:
        assert candidate.log_prob is not None
        tokens = [self._target_ids[piece] for piece in candidate.pieces]
        links = None if candidate.links is None else list(candidate.links)
        return Hypothesis(
            tokens=tokens,
            score=candidate.log_prob / length_penalty(len(tokens) + 1, alpha),
            log_prob=candidate.log_prob,
            links=links,
        )


def _draws(options: SearchOptions) -> int:
    """Hypotheses asked of CTranslate2 per source: the beam's, or the samples.

    Top-k 1 is CTranslate2's argmax, which refuses several hypotheses; its one result is every sample.
    """
    if options.sampling is None:
        return options.beam
    return 1 if options.sampling.top_k == 1 else options.nbest


def _search_alpha(options: SearchOptions) -> float:
    """The length penalty of CTranslate2's own scores: beam search's (greedy search and sampling sum)."""
    return options.length_penalty if options.sampling is None and options.beam > 1 else 0.0


def _rank_alpha(options: SearchOptions) -> float:
    """The length penalty of mtkit's scores: none in greedy search, as in the PyTorch engine."""
    return 0.0 if options.sampling is None and options.beam == 1 else options.length_penalty


def _links(attention: list[list[float]], length: int) -> list[int]:
    """Per output token, the source position (EOS excluded) its attention row weighs most.

    CTranslate2 gives no rows for an empty source; the PyTorch engine links to its EOS, position 0.
    """
    return [max(range(len(row)), key=row.__getitem__, default=0) for row in attention[:length]] + [0] * (length - len(attention))


def _distinct(candidates: list[_Candidate]) -> list[_Candidate]:
    """One candidate per output, preferring one whose log-probability is known (finished before the cap)."""
    kept: dict[tuple[str, ...], _Candidate] = {}
    for candidate in candidates:
        key = tuple(candidate.pieces)
        if key not in kept or kept[key].log_prob is None:
            kept[key] = candidate
    return list(kept.values())


def load_export(directory: Path | str, device: str = "cpu", *, compute_type: str = "default", threads: int = 0) -> LoadedModel:
    """The CTranslate2 engine over an export directory, for `Translator.over`.

    device: auto, cpu, cuda or cuda:N; threads 0 = one per core.

    CTranslate2's own default is 4 threads whatever the machine; on fewer cores they contend.
    """
    ctranslate2 = import_ctranslate2()
    directory = Path(directory)
    if not is_ctranslate2_export(directory):
        raise MtkitError(
            f"{directory}: not a CTranslate2 export (needs {MANIFEST} and model.bin); "
            "create one with `mtkit export -m RUN --format ctranslate2 -o DIR`"
        )
    manifest = read_manifest(directory)
    tokenizers = TokenizerPair.of(*(Tokenizer.load(export_file(directory, manifest["tokenizers"][side])) for side in SIDES))
    where = str(directory / MANIFEST)
    recipe = config_from_dict(manifest["recipe"], source=where, saved=True)
    given = config_from_dict(
        {"decode": manifest["decode"], "data": {"normalize": manifest["normalize"]}}, source=where, saved=True
    )
    device_name, _, index = device.partition(":")
    load = partial(
        ctranslate2.Translator,
        str(directory),
        device=device_name,
        device_index=int(index or 0),
        compute_type=compute_type,
        inter_threads=1,
        intra_threads=threads or cpu_cores(),
    )
    try:
        model = load()
    except (RuntimeError, ValueError) as err:
        raise MtkitError(f"{directory}: CTranslate2 cannot load it ({one_line(err)})") from None
    decode = given.decode
    engine = CT2Engine(
        model,
        tokenizers,
        max_positions=manifest["max_positions"],
        batch_tokens=decode.batch_beam_tokens,
        load=load,
        alignment_layer=manifest.get("alignment_layer"),
        vocabulary_map=(directory / VOCABULARY_MAP).is_file(),
    )
    return LoadedModel(engine=engine, tokenizers=tokenizers, decode=decode, normalize=given.data.normalize, config=recipe,
                       directory=Path(directory))  # fmt: skip


def read_manifest(directory: Path) -> dict[str, Any]:
    """An export's mtkit.json, its keys and their types checked, so that a damaged or hand-edited one is one line
    naming the key (the recipe's and decoding keys are checked by the recipe rules when they are read)."""
    path = directory / MANIFEST
    again = f"export the model again (mtkit export -m RUN --format ctranslate2 -o {directory} --force)"
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise MtkitError(f"{path}: {path.stat().st_size} bytes, more than an export's {MAX_MANIFEST_BYTES}; {again}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise MtkitError(f"{path}: not valid JSON ({one_line(err)}); {again}") from None
    if not isinstance(manifest, dict):
        raise MtkitError(f"{path}: holds {type(manifest).__name__}, not an object of keys; {again}")
    for key, kind in MANIFEST_KEYS.items():
        value = manifest.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 1):
            found = "missing" if key not in manifest else f"{json.dumps(value)[:60]}, not {MANIFEST_KINDS[kind]}"
            raise MtkitError(f"{path}: '{key}' is {found}; {again}")
    alignment = manifest.get("alignment_layer")
    if alignment is not None and (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 0):
        raise MtkitError(f"{path}: 'alignment_layer' is {json.dumps(alignment)[:60]}, not a layer number; {again}")
    if not all(isinstance(manifest["tokenizers"].get(side), str) for side in SIDES):
        raise MtkitError(
            f"{path}: 'tokenizers' is {json.dumps(manifest['tokenizers'])[:80]}, not {{src: FILE, tgt: FILE}}; {again}"
        )
    return manifest


def export_file(directory: Path, name: str) -> Path:
    """A tokenizer file the manifest names: a plain file name of a regular file inside the export (a link is
    followed only where it stays inside), so a manifest cannot make translate read files from elsewhere."""
    path = directory / name
    inside = name not in ("", ".", "..") and Path(name).name == name and "\\" not in name
    for candidate in (path, pieces_file(path)) if inside else ():
        if candidate.exists() and candidate.resolve().parent != directory.resolve():
            inside = False
    if not inside or not path.is_file():
        raise MtkitError(
            f"{directory / MANIFEST}: tokenizer {name!r} is not a file of this export; name a SentencePiece model "
            f"beside {MANIFEST} (source.spm, target.spm), or export the model again"
        )
    return path
