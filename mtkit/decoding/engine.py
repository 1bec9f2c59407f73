"""The translation engine interface, and the PyTorch engine.

An `Engine` searches batches of source ids (`SourceBatch`) as `SearchOptions` say, scores given
translations, and declares what it can do (`Capability`); the `mtkit.decoding.translator.Translator`
pipeline does everything else (text, segments, batching, order). `PyTorchEngine` drives any model
of the encode / decode contract with `mtkit.decoding.search`; `mtkit.decoding.ct2_engine.CT2Engine` drives a
CTranslate2 export.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from functools import partial
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from mtkit.config import Config, DecodeConfig
from mtkit.data.shortlist import Shortlist
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, TokenizerPair
from mtkit.decoding.alignment import link_hypotheses
from mtkit.decoding.sampling import draw
from mtkit.decoding.search import Hypothesis, SearchOptions, beam_search, greedy_search
from mtkit.decoding.shortlist import BatchVocabulary, ShortlistedModel
from mtkit.decoding.step_rules import StepRules
from mtkit.decoding.terminology.constrained import TermRequest, Terms
from mtkit.errors import MtkitError, OptionError
from mtkit.models.base import EncoderDecoder

Ends = tuple[int, int]  # BOS and EOS ids in the space a search runs in


class Capability(str, Enum):
    """What an engine can do beyond searching for the best translation."""

    NBEST = "n-best lists"
    ATTENTION = "attention weights"
    SCORE = "scoring given translations"
    PREFIX = "target prefixes"
    SAMPLING = "sampling"
    NO_REPEAT_NGRAM = "n-gram blocking"
    ALIGNMENTS = "word alignments"
    ENSEMBLE = "ensembles"
    CONSTRAINTS = "lexical constraints"


@dataclass(kw_only=True)
class SourceBatch:
    """Segments searched together: their places in `Plan.sources`, their ids, caps and prefixes."""

    indices: list[int]
    sources: list[list[int]]  # ids without EOS, longest first
    max_len: list[int]  # most output tokens of each, EOS excluded
    prefixes: list[list[int]] | None = None  # target ids each output must start with ([]: none)
    terms: TermRequest | None = None  # lexical constraints each output must contain


def require(engine: Engine, capability: Capability, *, option: str) -> None:
    """One clear error when `option` (an option's Python name, such as "no_repeat_ngram", or a command
    such as "mtkit score") needs a capability `engine` lacks."""
    if capability in engine.capabilities:
        return
    lacks = f"needs {capability.value}, which the {engine.name} engine lacks; {engine.alternative}"
    if option.isidentifier():
        raise OptionError(option, "{" + option + "} " + lacks)
    raise MtkitError(f"{option} {lacks}")


def shortlist_choice(engine: Engine, *, asked: bool | None) -> bool:
    """Whether to search over the engine's vocabulary shortlist: as asked, else when it has one."""
    if asked and not engine.has_shortlist:
        raise OptionError(
            "shortlist",
            "{shortlist}: this model has no vocabulary shortlist; build one with `mtkit shortlist RUN` "
            "(then export again for CTranslate2), or leave {shortlist} out",
        )
    return engine.has_shortlist if asked is None else asked


class Engine(ABC):
    """Searches batches of source ids; the `Translator` pipeline does everything else."""

    name: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]]
    alternative: ClassVar[str]  # how to get a capability this engine lacks
    max_positions: int  # longest source or target sequence, EOS/BOS included

    @property
    def has_shortlist(self) -> bool:
        """Whether the engine holds a vocabulary shortlist that `SearchOptions.shortlist` may turn on."""
        return False

    @abstractmethod
    def search(self, batch: SourceBatch, options: SearchOptions) -> list[list[Hypothesis]]:
        """The `nbest` best hypotheses (best first) of each source, in batch order.

        Beam 1 is greedy; with `options.sampling`, `nbest` drawn samples (best first).
        """

    @abstractmethod
    def score(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        """Log-probability of each target token and of the final EOS, given its source (ids, no EOS)."""

    @abstractmethod
    def check_alignment_layer(self, layer: int) -> None:
        """One clear error (`MtkitError`) unless hypotheses can be linked through decoder layer `layer`."""


class PyTorchEngine(Engine):
    """A model of the encode / decode contract, searched by `mtkit.decoding.search` on a torch device.

    The model is used in whatever mode it is in (validation switches a training model to eval
    itself); `Translator.load` puts a loaded model in eval mode.
    """

    name = "pytorch"
    capabilities = frozenset(Capability)
    alternative = "every feature is available in the PyTorch engine"

    def __init__(self, model: EncoderDecoder, device: torch.device | None = None, *, shortlist: Shortlist | None = None) -> None:
        self.device = device or torch.device("cpu")
        self.model = model.to(self.device)
        self.max_positions = model.max_positions
        self.shortlist = shortlist  # the run's vocabulary shortlist, used where `SearchOptions.shortlist` says

    @property
    def has_shortlist(self) -> bool:
        return self.shortlist is not None

    def search(self, batch: SourceBatch, options: SearchOptions) -> list[list[Hypothesis]]:
        src, src_mask = self._source(batch.sources)
        if options.shortlist and self.shortlist is not None:
            vocabulary = self._vocabulary(batch, options, self.shortlist)
            found = self._search(ShortlistedModel(self.model, vocabulary), src, src_mask, *_reduced(batch, options, vocabulary))
            for hypotheses in found:
                for hypothesis in hypotheses:
                    hypothesis.tokens = vocabulary.full(hypothesis.tokens)
        else:
            found = self._search(self.model, src, src_mask, batch, options)
        if options.alignment_layer is not None:
            link_hypotheses(self.model, src, src_mask=src_mask, found=found, layer=options.alignment_layer)
        return found

    def _search(
        self,
        model: EncoderDecoder,
        src: Tensor,
        src_mask: Tensor,
        batch: SourceBatch,
        options: SearchOptions,
        ends: Ends = (BOS_ID, EOS_ID),
    ) -> list[list[Hypothesis]]:
        """Greedy, beam or sampling search of `model` (ids `ends`: BOS and EOS in its output space)."""
        padded = len({len(source) for source in batch.sources}) > 1  # from the lengths: no wait for the device
        caps = torch.tensor(batch.max_len, device=self.device)  # (B,)
        if options.sampling is not None:
            return self._sample(model, src, src_mask, caps, batch.prefixes, options, ends)
        step_rules = StepRules.build(batch.prefixes, options.no_repeat_ngram, device=self.device, forced_lead=options.forced_lead)
        bos_id, eos_id = ends
        if options.beam == 1:  # greedy scores are total log-probabilities, as CTranslate2's are
            summed = replace(options, length_penalty=0.0)
            greedy = greedy_search(
                model,
                src,
                src_mask=src_mask,
                max_len=caps,
                options=summed,
                step_rules=step_rules,
                src_padded=padded,
                bos_id=bos_id,
                eos_id=eos_id,
            )
            return [[h] for h in greedy]
        terms = Terms.build(batch.terms, self.device) if batch.terms is not None and batch.terms.any else None
        return beam_search(
            model,
            src,
            src_mask=src_mask,
            max_len=caps,
            options=options,
            step_rules=step_rules,
            terms=terms,
            src_padded=padded,
            bos_id=bos_id,
            eos_id=eos_id,
        )

    def _vocabulary(self, batch: SourceBatch, options: SearchOptions, shortlist: Shortlist) -> BatchVocabulary:
        """The batch's vocabulary: its sources' shortlists, its prefixes' and constraints' pieces, EOS and the specials."""
        needed = [EOS_ID, BOS_ID, *options.never, *(i for prefix in batch.prefixes or [] for i in prefix)]
        if batch.terms is not None:
            needed += [
                i for terms in batch.terms.constraints for alternatives in terms for phrase in alternatives for i in phrase
            ]
        return BatchVocabulary.of(shortlist, batch.sources, needed=needed, vocab_size=shortlist.target_vocab, device=self.device)

    @torch.inference_mode()
    def score(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        src, src_mask = self._source(sources)
        tgt = torch.full((len(targets), max(len(t) for t in targets) + 1), PAD_ID, dtype=torch.long)  # (B, T)
        gold = tgt.clone()  # (B, T) the token each position predicts
        for row, target in enumerate(targets):
            tgt[row, : len(target) + 1] = torch.tensor([BOS_ID, *target])
            gold[row, : len(target) + 1] = torch.tensor([*target, EOS_ID])
        logits = self.model(src, src_mask, tgt.to(self.device))  # (B, T, V)
        log_probs = torch.log_softmax(logits.float(), dim=-1).gather(2, gold.to(self.device).unsqueeze(2)).squeeze(2)
        return [log_probs[row, : len(target) + 1].tolist() for row, target in enumerate(targets)]

    def check_alignment_layer(self, layer: int) -> None:
        layers = self.model.attention_layers
        if layers == 0:
            raise OptionError("alignments", "{alignments}: this model has no attention to align with (model.attention: none)")
        if not -layers <= layer < layers:
            raise OptionError(
                "alignment_layer",
                "{alignment_layer} {value}: the model's decoder has {layers} attention layer(s); "
                "give 0 to {top}, or -1 for the last",
                value=layer,
                layers=layers,
                top=layers - 1,
            )

    def _source(self, sources: list[list[int]]) -> tuple[Tensor, Tensor]:
        """(B, S) padded ids with EOS, and their mask."""
        width = max(len(s) for s in sources) + 1
        rows = [[*source, EOS_ID] + [PAD_ID] * (width - len(source) - 1) for source in sources]
        src = torch.tensor(rows, dtype=torch.long, device=self.device)  # (B, S): one tensor made, not one a sentence
        return src, src.ne(PAD_ID)

    def _sample(
        self,
        model: EncoderDecoder,
        src: Tensor,
        src_mask: Tensor,
        caps: Tensor,
        prefixes: list[list[int]] | None,
        options: SearchOptions,
        ends: Ends,
    ) -> list[list[Hypothesis]]:
        """`nbest` samples of each source, drawn as rows of one greedy search, best first."""
        assert options.sampling is not None
        count = options.nbest
        rows = torch.arange(src.size(0), device=self.device).repeat_interleave(count)  # (B*N,)
        repeated = [prefix for prefix in prefixes for _ in range(count)] if prefixes else None
        step_rules = StepRules.build(repeated, options.no_repeat_ngram, device=self.device, forced_lead=options.forced_lead)
        generator = torch.Generator(device=self.device).manual_seed(options.sampling.seed)
        pick = partial(draw, sampling=options.sampling, generator=generator, never=options.never)
        drawn = greedy_search(
            model,
            src[rows],
            src_mask=src_mask[rows],
            max_len=caps[rows],
            options=options,
            step_rules=step_rules,
            pick=pick,
            bos_id=ends[0],
            eos_id=ends[1],
        )
        return [sorted(drawn[i : i + count], key=lambda h: h.score, reverse=True) for i in range(0, len(drawn), count)]


def _reduced(batch: SourceBatch, options: SearchOptions, vocabulary: BatchVocabulary) -> tuple[SourceBatch, SearchOptions, Ends]:
    """The batch's prefixes and constraints, the ids never emitted, BOS and EOS, in `vocabulary`'s reduced ids."""
    prefixes = [vocabulary.reduced(prefix) for prefix in batch.prefixes] if batch.prefixes is not None else None
    terms = batch.terms
    if terms is not None:
        constraints = [
            [[vocabulary.reduced(phrase) for phrase in alternatives] for alternatives in of_source]
            for of_source in terms.constraints
        ]
        continues = tuple(
            bool(terms.continues_word[i]) if i < len(terms.continues_word) else False for i in vocabulary.kept.tolist()
        )
        terms = replace(terms, constraints=constraints, continues_word=continues)
    bos_id, eos_id = vocabulary.reduced([BOS_ID, EOS_ID])
    return (
        replace(batch, prefixes=prefixes, terms=terms),
        replace(options, never=vocabulary.present(options.never)),
        (bos_id, eos_id),
    )


@dataclass(kw_only=True)
class LoadedModel:
    """An engine and what a `Translator` needs around it: tokenizers, decoding defaults, text normalisation, recipe."""

    engine: Engine
    tokenizers: TokenizerPair
    decode: DecodeConfig
    normalize: str = "NFC"
    config: Config | None = None  # the training recipe, when loaded from a run or an export
    directory: Path | None = None  # the run or export directory it was loaded from: its other files (word priors)


def output_cap(source_length: int, decode: DecodeConfig, *, max_positions: int) -> int:
    """The one output-length rule: at most `max_len_a * |src| + max_len_b` tokens (EOS excluded).

    |src| counts the source's EOS; the product is taken in float32, at least 1, and the output
    (with BOS) must fit the model's positions.
    """
    length = int(np.float32(source_length) * np.float32(decode.max_len_a) + np.float32(decode.max_len_b))
    return min(max(length, 1), max_positions - 1)


def length_batches(lengths: Sequence[int], beam: int, *, batch_tokens: int) -> Iterator[list[int]]:
    """Indices sorted by length (longest first) in batches of at most `batch_tokens` source tokens x beam."""
    batch: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True):
        width = lengths[batch[0]] + 1 if batch else lengths[index] + 1  # + EOS
        if batch and (len(batch) + 1) * width * beam > batch_tokens:
            yield batch
            batch = []
        batch.append(index)
    if batch:
        yield batch
