"""The cleaning rules of `mtkit prepare` that judge training pairs with a model, each a `data.corpora.PairFilter`:

- `LanguageFilter` (data.langid): py3langid must find the source in the source language and the target in the
  target language;
- `DualCrossEntropyFilter` (data.dual_xent_*): dual conditional cross-entropy (Junczys-Dowmunt 2018) from two
  mtkit models of opposite directions, as `mtkit score` computes their log-probabilities;
- `QualityFilter` (data.qe_*): a reference-free COMET model's score must reach a threshold.

They are built here, above data, because they read decoding's `Translator` and evaluation's `CometScorer`;
`corpus_filters` builds those a recipe sets, and `mtkit prepare` hands them to the `Cleaner`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mtkit.config import Config, split_languages
from mtkit.data.corpora import Pair, PairFilter
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.comet.scorer import CometScorer
from mtkit.evaluation.language import base_language, language_identifier


class LanguageFilter:
    """Drops a pair whose source py3langid identifies as another language than the source's (or target, target's)."""

    name = "langid"

    def __init__(self, identifier: Any) -> None:
        self.identifier = identifier

    def drops(self, pairs: list[Pair], languages: tuple[str, str]) -> list[str | None]:
        """Per pair: None, or the languages found where they are not the corpus's (`source fr`, `target de`)."""
        wanted = [base_language(lang) for lang in languages]
        verdicts = []
        for pair in pairs:
            found = [self.identifier.classify(text)[0] for text in pair]
            wrong = [f"{side} {code}" for side, code, lang in zip(("source", "target"), found, wanted, strict=True)
                     if code != lang]  # fmt: skip
            verdicts.append(", ".join(wrong) or None)
        return verdicts


def dual_cross_entropy(forward: float, backward: float) -> float:
    """|H_fwd - H_bwd| + (H_fwd + H_bwd) / 2, of two per-token cross-entropies: low when both models find the pair
    likely and agree on it (Junczys-Dowmunt 2018, section 3.1)."""
    return abs(forward - backward) + 0.5 * (forward + backward)


class DualCrossEntropyFilter:
    """Drops pairs by dual conditional cross-entropy: those scoring above `most`, or the worst `share` of each chunk."""

    name = "dual_xent"

    def __init__(self, forward: Translator, backward: Translator, *, most: float | None, share: float | None) -> None:
        self.forward, self.backward, self.most, self.share = forward, backward, most, share

    def scores(self, pairs: Sequence[Pair]) -> list[float]:
        """Each pair's dual cross-entropy, in nats a token (target and EOS for the forward model, source and EOS for
        the backward one)."""
        sources, targets = [src for src, _ in pairs], [tgt for _, tgt in pairs]
        forward, backward = self.forward.score(sources, targets), self.backward.score(targets, sources)
        return [dual_cross_entropy(-f.average, -b.average) for f, b in zip(forward, backward, strict=True)]

    def drops(self, pairs: list[Pair], languages: tuple[str, str]) -> list[str | None]:
        """Per pair: None, or its score."""
        scores = self.scores(pairs)
        if self.most is not None:
            dropped = {index for index, score in enumerate(scores) if score > self.most}
        else:
            assert self.share is not None, "the recipe's check asks for one of the two"
            worst = sorted(range(len(scores)), key=lambda index: -scores[index])
            dropped = set(worst[: round(self.share * len(scores))])
        return [f"{score:.4f}" if index in dropped else None for index, score in enumerate(scores)]


class QualityFilter:
    """Drops pairs a reference-free COMET model scores below `minimum`."""

    name = "qe"

    def __init__(self, scorer: CometScorer, minimum: float) -> None:
        self.scorer, self.minimum = scorer, minimum

    def drops(self, pairs: list[Pair], languages: tuple[str, str]) -> list[str | None]:
        """Per pair: None, or its score."""
        scores = self.scorer.score([src for src, _ in pairs], [tgt for _, tgt in pairs])
        return [f"{score:.4f}" if score < self.minimum else None for score in scores]


def corpus_filters(config: Config, *, device: str = "auto", fast_paths: bool = False) -> list[PairFilter]:
    """The filter rules the recipe sets, cheapest first, their models loaded on `device` and checked (one line for
    each mistake); `fast_paths`: see `Translator.load`."""
    data, filters = config.data, []
    if data.langid:
        filters.append(LanguageFilter(_identifier_for(config)))
    if data.dual_xent_forward is not None and data.dual_xent_backward is not None:
        forward = _direction_model(config, data.dual_xent_forward, "data.dual_xent_forward", device, fast_paths)
        backward = _direction_model(config, data.dual_xent_backward, "data.dual_xent_backward", device, fast_paths, back=True)
        filters.append(DualCrossEntropyFilter(forward, backward, most=data.dual_xent_max, share=data.dual_xent_drop))
    if data.qe_model is not None and data.qe_min is not None:
        filters.append(QualityFilter(_qe_scorer(data.qe_model, data.qe_encoder, device), data.qe_min))
    return filters


def _identifier_for(config: Config) -> Any:
    """py3langid's identifier, after checking it knows every training corpus's languages."""
    identifier = language_identifier("data.langid")
    for source in config.data.train:
        unknown = [lang for lang in split_languages(config, source) if base_language(lang) not in identifier.nb_classes]
        if unknown:
            raise MtkitError(
                f"data.langid: py3langid does not identify language {unknown[0]!r}; give ISO 639-1 codes (src_lang, "
                "tgt_lang) such as de and en, or set data.langid=false"
            )
    return identifier


def _direction_model(config: Config, path: str, key: str, device: str, fast_paths: bool, back: bool = False) -> Translator:
    """The model at `path`, checked to translate the recipe's direction (or, `back`, the reverse) where it says."""
    translator = Translator.load(Path(path), device=device, fast_paths=fast_paths)
    wanted = (config.tgt_lang, config.src_lang) if back else (config.src_lang, config.tgt_lang)
    model = translator.config
    if model is not None and (model.src_lang, model.tgt_lang) != wanted:
        raise MtkitError(
            f"{key}: {path} translates {model.src_lang}->{model.tgt_lang}; the rule needs a {wanted[0]}->{wanted[1]} model"
        )
    return translator


def _qe_scorer(model: str, encoder: str | None, device: str) -> CometScorer:
    """The COMET model of data.qe_model, checked to be reference-free; its errors worded for the recipe's keys."""
    try:
        scorer = CometScorer.load(CometOptions(model=model, encoder=Path(encoder) if encoder else None, device=device))
    except MtkitError as err:
        raise MtkitError(
            str(err).replace("--comet-model", "data.qe_model").replace("--comet-encoder", "data.qe_encoder")
        ) from None
    if scorer.needs_references:
        raise MtkitError(
            f"data.qe_model: {model} scores against references, which training pairs lack; give a reference-free (QE) "
            "model such as Unbabel/wmt22-cometkiwi-da"
        )
    return scorer
