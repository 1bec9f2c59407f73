"""The drivers behind `mtkit tokenizer train` and `mtkit prepare`.

`train_tokenizers` learns the SentencePiece models from the training split; `prepare_corpus`
cleans and encodes every split into memory-mapped Arrow datasets under the data directory, which
`load_prepared` opens again for training.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import datasets
from tqdm import tqdm

from mtkit.config import Config, SplitConfig
from mtkit.data import CleanReport, Pair, clean_pairs, iter_split
from mtkit.errors import MtkitError
from mtkit.tokenizer import Tokenizer, TokenizerPair, load_tokenizers, tokenizer_files, train_sentencepiece

# Sequence (a List in datasets >= 4) keeps older datasets releases working too.
FEATURES = datasets.Features(
    {
        "src": datasets.Value("string"),
        "tgt": datasets.Value("string"),
        "src_ids": datasets.Sequence(datasets.Value("int32")),
        "tgt_ids": datasets.Sequence(datasets.Value("int32")),
    }
)
ENCODE_CHUNK = 10_000  # sentences per encode_batch call: one progress-bar step
REPORT_FILE = "prepare_report.json"


def train_tokenizers(config: Config) -> TokenizerPair:
    """Train the SentencePiece model(s) on the training split and save them in the data directory.

    The corpus is streamed: only a uniform sample of `tokenizer.max_sentences` sentences (per model)
    is held in memory, so a corpus of any size can be read.
    """
    settings = config.tokenizer

    def train(sentences: Iterable[str]) -> Tokenizer:
        return train_sentencepiece(
            sentences,
            settings.vocab_size,
            model_type=settings.type,
            character_coverage=settings.character_coverage,
            max_sentences=settings.max_sentences,
            seed=config.train.seed,
        )

    def pairs() -> Iterator[Pair]:
        return _pairs(config, "train", config.data.train)

    if settings.joint:
        joint = train(sentence for pair in pairs() for sentence in pair)
        tokenizers = TokenizerPair(joint, joint)
    else:
        tokenizers = TokenizerPair(train(src for src, _ in pairs()), train(tgt for _, tgt in pairs()))
    config.data_path.mkdir(parents=True, exist_ok=True)
    src_path, tgt_path = tokenizer_files(config.data_path, settings.joint)
    tokenizers.src.save(src_path)
    if not settings.joint:
        tokenizers.tgt.save(tgt_path)
    return tokenizers


def prepare_corpus(config: Config) -> dict[str, Any]:
    """Clean the training split, encode every split and save it as an Arrow dataset.

    Writes data_dir/{train,valid,test} and data_dir/prepare_report.json; returns the report:
    {"clean": CleanReport.to_dict(), "splits": {name: {"pairs", "src_tokens", "tgt_tokens"}}}.
    """
    tokenizers = load_tokenizers(config.data_path, config.tokenizer.joint)
    splits = {"train": config.data.train, "valid": config.data.valid}
    if config.data.test is not None:
        splits["test"] = config.data.test
    report: dict[str, Any] = {"clean": None, "splits": {}}
    for name, split in splits.items():
        pairs = _read(config, name, split)
        clean_report = None
        if name == "train":
            pairs, clean_report = clean_pairs(pairs, config.data)
            report["clean"] = clean_report.to_dict()
        _check_not_empty(pairs, name, clean_report)
        report["splits"][name] = _save_split(pairs, tokenizers, config.data_path / name)
    (config.data_path / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def load_prepared(data_dir: Path, split: str) -> datasets.Dataset:
    """Open a split written by `prepare_corpus` (memory-mapped, nothing is loaded into RAM)."""
    try:
        return datasets.load_from_disk(str(data_dir / split))
    except FileNotFoundError:
        raise MtkitError(f"{data_dir}: prepared split '{split}' not found; run `mtkit prepare RECIPE` first") from None


def _pairs(config: Config, name: str, split: SplitConfig) -> Iterator[Pair]:
    normalize, bad_bytes = config.data.normalize, config.data.bad_bytes
    return iter_split(split, config.src_lang, config.tgt_lang, normalize, recipe_key=f"data.{name}", bad_bytes=bad_bytes)


def _read(config: Config, name: str, split: SplitConfig) -> list[Pair]:
    return list(_pairs(config, name, split))


def _check_not_empty(pairs: list[Pair], name: str, clean_report: CleanReport | None) -> None:
    if pairs:
        return
    if clean_report is not None:
        counts = ", ".join(f"{rule} {count}" for rule, count in clean_report.to_dict().items())
        raise MtkitError(
            f"data.{name}: cleaning removed every pair ({counts}); relax data.max_len or data.max_ratio, or check the corpus"
        )
    raise MtkitError(f"data.{name}: the split has no sentence pairs; check data.{name} in the recipe")


def _save_split(pairs: list[Pair], tokenizers: TokenizerPair, path: Path) -> dict[str, int]:
    """Encode one split, save it to `path`, and return its pair and token counts."""
    sources = [src for src, _ in pairs]
    targets = [tgt for _, tgt in pairs]
    src_ids = _encode(tokenizers.src, sources, f"encoding {path.name} source")
    tgt_ids = _encode(tokenizers.tgt, targets, f"encoding {path.name} target")
    dataset = datasets.Dataset.from_dict(
        {"src": sources, "tgt": targets, "src_ids": src_ids, "tgt_ids": tgt_ids}, features=FEATURES
    )
    with _datasets_progress_bars_off():
        dataset.save_to_disk(str(path))
    return {"pairs": len(pairs), "src_tokens": sum(map(len, src_ids)), "tgt_tokens": sum(map(len, tgt_ids))}


def _encode(tokenizer: Tokenizer, sentences: list[str], description: str) -> list[list[int]]:
    """Token ids without BOS/EOS, encoded in batches with a progress bar (hidden when not on a terminal)."""
    ids: list[list[int]] = []
    with tqdm(total=len(sentences), desc=description, unit=" sentences", disable=None, leave=False) as progress:
        for start in range(0, len(sentences), ENCODE_CHUNK):
            chunk = sentences[start : start + ENCODE_CHUNK]
            ids.extend(tokenizer.encode_batch(chunk))
            progress.update(len(chunk))
    return ids


@contextlib.contextmanager
def _datasets_progress_bars_off() -> Iterator[None]:
    """Silence the `datasets` save bar here without changing the setting for the caller."""
    were_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if were_enabled:
            datasets.enable_progress_bars()
