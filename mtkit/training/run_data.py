"""The data a training run reads, made ready: `mtkit tokenizer train` and `mtkit prepare`, each one call.

`train_run_tokenizers` learns the recipe's SentencePiece models (refused for a fine-tuning recipe,
which keeps its parent's). `prepare_run_data` is the whole of `mtkit prepare`: a fine-tuning
recipe's tokenizers from its parent (`mtkit.training.finetune`), the synthetic corpora written by
their models (`mtkit.synthetic`), then every split cleaned, encoded and stored (`mtkit.data.prepare`,
which holds the steps that need no model). It lives in training/ because fine-tuning's rules do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mtkit.config import Config, recipe_key
from mtkit.data.corpora import clean_table
from mtkit.data.prepare import prepare_corpus, train_tokenizers
from mtkit.data.store import REPORT_FILE
from mtkit.data.tokenizer import TokenizerPair
from mtkit.evaluation.filters import corpus_filters
from mtkit.synthetic.generate import synthesize
from mtkit.training.finetune import inherit_tokenizers, refuse_tokenizer_training


@dataclass(frozen=True, kw_only=True)
class RunTokenizers:
    """What `mtkit tokenizer train` learnt for a recipe, saved in its data directory."""

    config: Config
    tokenizers: TokenizerPair

    def lines(self) -> list[str]:
        """What the command prints: each synthetic corpus's side the tokenizer learnt from, then the vocabulary."""
        config, pair = self.config, self.tokenizers
        said = []
        for index, source in enumerate(config.data.train):
            if source.generated_side is not None:  # the model writes it at `mtkit prepare`, with these tokenizers' help
                given = "tgt" if source.generated_side == "src" else "src"
                key = recipe_key(config.data, "train", index=index)
                said.append(f"{key}: its {source.generated_side} is written by a model; the tokenizer learns from its {given}")
        sizes = f"{pair.src.vocab_size}" if pair.joint else f"{pair.src.vocab_size} (src) / {pair.tgt.vocab_size} (tgt)"
        shape = f"{config.tokenizer.type}, {'joint' if pair.joint else 'separate'}, vocabulary {sizes}"
        return [*said, f"tokenizer ({shape}) written to {config.data_path}"]


@dataclass(frozen=True, kw_only=True)
class PreparedData:
    """What `mtkit prepare` wrote: a fine-tuning recipe's inherited tokenizers and the prepared splits."""

    config: Config
    inherited: str | None  # the parent's tokenizers, e.g. "vocabulary 8000 + 412 new pieces"; None without a parent
    report: dict[str, Any] | None  # `prepare_corpus`'s report; None on a torchrun rank other than 0

    def lines(self) -> list[str]:
        """What the command prints: the inherited tokenizers, what cleaning removed per corpus, the splits' sizes."""
        data_path, said = self.config.data_path, []
        if self.inherited is not None:
            said.append(f"the tokenizers of {self.config.train.init_from} ({self.inherited}) written to {data_path}")
        if self.report is not None:
            said.append(clean_table({corpus["name"]: corpus["clean"] for corpus in self.report["corpora"]}))
            said.append(f"prepared data written to {data_path} (report: {data_path / REPORT_FILE})")
            said.append(json.dumps(self.report["splits"], indent=1))
        return said


def train_run_tokenizers(config: Config, source: str) -> RunTokenizers:
    """`mtkit tokenizer train`: learn the recipe's tokenizers from its training text and save them in its
    data directory; an error for a fine-tuning recipe (`source` names it), which keeps its parent's."""
    refuse_tokenizer_training(config, source)
    return RunTokenizers(config=config, tokenizers=train_tokenizers(config))


def prepare_run_data(config: Config, *, extend_vocab: int = 0, device: str = "auto", fast_paths: bool = False) -> PreparedData:
    """`mtkit prepare`: with `train.init_from`, the parent's tokenizers (grown by an `extend_vocab`-piece
    vocabulary of the new data when > 0); each synthetic corpus written by its model on `device`, once
    (cached in the data directory); then every split read, cleaned (the filter rules' models on `device` too),
    encoded and stored. `fast_paths`: the
    translating models load with the CPU fast paths (process-wide; see `Translator.load`).

    Under torchrun every rank writes its share of the synthetic corpora and rank 0 alone prepares the splits.
    """
    inherited = inherit_tokenizers(config, extend_vocab)  # a bad --extend-vocab is refused before anything is written
    ready = synthesize(config, device, fast_paths=fast_paths)
    if ready is None:
        return PreparedData(config=config, inherited=inherited, report=None)
    filters = corpus_filters(ready, device=device, fast_paths=fast_paths)  # checked before a pair is prepared
    return PreparedData(config=config, inherited=inherited, report=prepare_corpus(ready, filters))
