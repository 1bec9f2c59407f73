"""The drivers behind `mtkit tokenizer train` and `mtkit prepare`.

`train_tokenizers` learns the SentencePiece models from the training corpora; `prepare_corpus`
streams every split through read -> normalise -> clean -> encode -> write in chunks of
`CHUNK_PAIRS` pairs and at most `CHUNK_BYTES` of text, so its memory does not grow with the corpus or its
lines. Encoding (SentencePiece's threads, one per core) runs in the background while the next chunk is read and
cleaned.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from mtkit.config import Config, SplitConfig, corpus_tags, recipe_key, split_languages, tag_languages
from mtkit.data.corpora import (
    Cleaner,
    CleanReport,
    DroppedPair,
    Pair,
    PairFilter,
    character_cap,
    corpus_names,
    iter_side,
    iter_split,
)
from mtkit.data.language_codes import recipe_code_id
from mtkit.data.store import SCHEMA, TRAIN_SCHEMA, PreparedWrite, SplitWriter, load_prepared
from mtkit.data.tokenizer import (
    Tag,
    Tokenizer,
    TokenizerPair,
    corpus_tag_piece,
    load_tokenizers,
    tokenizer_files,
    train_sentencepiece,
)
from mtkit.errors import MtkitError

__all__ = ["learn_tokenizers", "load_prepared", "prepare_corpus", "save_tokenizers", "train_tokenizers"]
CHUNK_PAIRS = 20_000  # pairs read, cleaned, encoded and written together
# and the most memory their text may take (Python's size of the strings): a corpus of long lines is cut in smaller
# chunks, as two chunks are alive at once (one encoded while the next is read and cleaned)
CHUNK_BYTES = 32 << 20


def train_tokenizers(config: Config) -> TokenizerPair:
    """Train the SentencePiece model(s) on the training split and save them in the data directory.

    The corpus is streamed: only a uniform sample of `tokenizer.max_sentences` sentences (per model)
    is held in memory, so a corpus of any size can be read.
    """
    tokenizers = learn_tokenizers(config, config.tokenizer.vocab_size, joint=config.tokenizer.joint)
    save_tokenizers(tokenizers, config)
    return tokenizers


def learn_tokenizers(config: Config, vocab_size: int, *, joint: bool) -> TokenizerPair:
    """SentencePiece model(s) of `vocab_size` pieces learnt from the training split, with the recipe's settings."""
    settings = config.tokenizer
    tags = tag_languages(config) if config.data.lang_tag == "target" else []

    def train(sentences: Iterable[str], tags: list[str] = tags, corpora: list[str] = corpus_tags(config)) -> Tokenizer:
        return train_sentencepiece(
            sentences,
            vocab_size,
            model_type=settings.type,
            character_coverage=settings.character_coverage,
            max_sentences=settings.max_sentences,
            seed=config.train.seed,
            tag_langs=tags,
            corpus_tags=corpora,
        )

    def sentences(sides: tuple[int, ...]) -> Iterator[str]:
        """The training text of `sides` (0: source, 1: target), pair by pair; a synthetic corpus gives its real side."""
        for index, source in enumerate(config.data.train):
            key = recipe_key(config.data, "train", index=index)
            if source.generated_side is None:
                yield from (pair[side] for pair in _pairs(config, key, source) for side in sides)
            elif (given := 1 if source.generated_side == "src" else 0) in sides:
                path, data = source.tgt if given else source.src, config.data
                yield from iter_side(
                    Path(path),
                    data.normalize,
                    limit=source.limit,
                    recipe_key=f"{key}.{('src', 'tgt')[given]}",
                    bad_bytes=data.bad_bytes,
                )

    if joint:
        shared = train(sentences((0, 1)))
        return TokenizerPair(shared, shared)
    return TokenizerPair(train(sentences((0,))), train(sentences((1,)), tags=[], corpora=[]))


def save_tokenizers(tokenizers: TokenizerPair, config: Config) -> None:
    """Write the tokenizers where `mtkit prepare` and training read them."""
    config.data_path.mkdir(parents=True, exist_ok=True)
    src_path, tgt_path = tokenizer_files(config.data_path, joint=config.tokenizer.joint)
    tokenizers.src.save(src_path)
    if not config.tokenizer.joint:
        tokenizers.tgt.save(tgt_path)


def prepare_corpus(config: Config, filters: Sequence[PairFilter] = ()) -> dict:
    """Clean the training corpora (with the recipe's filter rules, `filters`, built by `mtkit.evaluation.filters`),
    encode every split and write them under the data directory.

    Writes data_dir/{train,valid,test} and data_dir/prepare_report.json (and, with filters, data_dir/dropped.tsv),
    replacing the old ones only when every split is written; returns the report: {"clean": CleanReport.to_dict() of
    all corpora, "corpora": [{"name", "weight", "clean"}], "splits": {name: {"pairs", "src_tokens", "tgt_tokens"}}}.
    """
    tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    with PreparedWrite(config.data_path) as output, ThreadPoolExecutor(max_workers=1) as encoder:
        pipeline = _Pipeline(tokenizers, encoder)
        report = {"splits": {"train": _prepare_train(config, output, pipeline, Cleaner(config.data, filters))}}
        report |= report["splits"]["train"].pop("report")
        tests = {"valid": config.data.valid} | ({"test": config.data.test} if config.data.test is not None else {})
        for name, splits in tests.items():
            writer = output.split(name, TRAIN_SCHEMA if len(splits) > 1 else SCHEMA)
            for index, split in enumerate(splits):
                key = recipe_key(config.data, name, index=index)
                tag, lead = (
                    corpus_tag(config, tokenizers, split=split, key=key),
                    corpus_lead(config, tokenizers, split=split, key=key),
                )
                for chunk in _chunks(_pairs(config, key, split), name):
                    pipeline.put(writer, chunk, corpus=index, tag=tag, lead=lead)
            report["splits"][name] = pipeline.finish(writer)
            if not report["splits"][name]["pairs"]:
                raise MtkitError(f"data.{name}: the split has no sentence pairs; check data.{name} in the recipe")
        output.commit(report)
    return report


class _Pipeline:
    """Encodes and writes chunks in a background thread while the caller reads and cleans the next one."""

    def __init__(self, tokenizers: TokenizerPair, encoder: ThreadPoolExecutor) -> None:
        self.tokenizers = tokenizers
        self.encoder = encoder
        self.pending: Future | None = None  # at most one chunk waits, so memory holds about two

    def put(self, writer: SplitWriter, pairs: list[Pair], corpus: int, tag: Tag = None, lead: Tag = None) -> None:
        self.wait()
        self.pending = self.encoder.submit(writer.write, pairs, self.tokenizers, corpus=corpus, tag=tag, lead=lead)

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def finish(self, writer: SplitWriter) -> dict[str, int]:
        self.wait()
        return writer.close()


def _prepare_train(config: Config, output: PreparedWrite, pipeline: _Pipeline, cleaner: Cleaner) -> dict:
    """Stream every training corpus through one `Cleaner` (duplicates are found across corpora); the pairs its
    filter rules drop listed as they go."""
    writer = output.split("train", TRAIN_SCHEMA)
    names = corpus_names(config.data.train)
    reports = [CleanReport() for _ in names]
    if cleaner.filters:
        output.start_dropped()
    for index, source in enumerate(config.data.train):
        key = recipe_key(config.data, "train", index=index)
        tag, languages = corpus_tag(config, pipeline.tokenizers, split=source, key=key), split_languages(config, source)
        lead = corpus_lead(config, pipeline.tokenizers, split=source, key=key)
        pairs = _pairs(config, key, source, max_chars=character_cap(config.data))  # cut while read: see iter_split
        for chunk in _chunks(pairs, f"train {names[index]}"):
            dropped: list[DroppedPair] = []
            kept = cleaner.clean(chunk, reports[index], languages=languages, dropped=dropped, corpus=names[index])
            if dropped:
                output.add_dropped([pair.line() for pair in dropped])
            if kept:
                pipeline.put(writer, kept, corpus=index, tag=tag, lead=lead)
        if not reports[index].total:
            raise MtkitError(f"{key}: the corpus has no sentence pairs; check {key} in the recipe")
    counts = pipeline.finish(writer)
    total = CleanReport.total_of(reports)
    if not total.kept:
        rules = ", ".join(f"{rule} {count}" for rule, count in total.to_dict().items())
        raise MtkitError(
            f"data.train: cleaning removed every pair ({rules}); relax data.max_len or data.max_ratio, or check the corpus"
        )
    corpora = [
        {"name": name, "weight": source.weight, "clean": report.to_dict()}
        for name, source, report in zip(names, config.data.train, reports, strict=True)
    ]
    return {**counts, "report": {"clean": total.to_dict(), "corpora": corpora}}


def _chunks(pairs: Iterable[Pair], description: str) -> Iterator[list[Pair]]:
    """Lists of `CHUNK_PAIRS` pairs, or fewer whose text reached `CHUNK_BYTES`, with a pairs/s progress bar (hidden
    when stderr is not a terminal)."""
    chunk: list[Pair] = []
    size = 0
    with tqdm(desc=f"preparing {description}", unit=" pairs", unit_scale=True, disable=None, leave=False) as progress:
        for pair in pairs:
            chunk.append(pair)
            size += sys.getsizeof(pair[0]) + sys.getsizeof(pair[1])
            if len(chunk) == CHUNK_PAIRS or size >= CHUNK_BYTES:
                progress.update(len(chunk))
                yield chunk
                chunk, size = [], 0
        if chunk:
            progress.update(len(chunk))
            yield chunk


def corpus_tag(config: Config, tokenizers: TokenizerPair, *, split: SplitConfig, key: str) -> Tag:
    """The tag a corpus's sources start with: its target-language tag (a tagged recipe) or its source-language
    code (a model with codes), then the corpus's own tag (`split.tag`); None when none."""
    language = _language_tag(config, tokenizers, split, key)
    name = getattr(split, "tag", None)
    if name is None:
        return language
    corpus = tokenizers.src.control_id(corpus_tag_piece(name))
    if corpus is None:
        raise MtkitError(
            f"{key}.tag: the tokenizer reserves no piece {corpus_tag_piece(name)}; corpus tags are reserved when the "
            "tokenizer is trained: run `mtkit tokenizer train RECIPE` again"
        )
    return (corpus,) if language is None else (language, corpus)


def check_language_codes(config: Config, tokenizers: TokenizerPair) -> None:
    """Resolve every split's language codes (a model with codes) as prepare will, so that a code the model lacks is
    one line before the tokenizers are written."""
    for name in ("train", "valid", "test"):
        for index, split in enumerate(getattr(config.data, name) or []):
            key = recipe_key(config.data, name, index=index)
            corpus_tag(config, tokenizers, split=split, key=key)
            corpus_lead(config, tokenizers, split=split, key=key)


def corpus_lead(config: Config, tokenizers: TokenizerPair, *, split: SplitConfig, key: str) -> Tag:
    """What a corpus's targets start with: its target-language code for a model with codes (`data.lang_tag: code`,
    written as the family writes it: the decoder starts from </s>, then the code), else nothing (None)."""
    return _language_code(config, tokenizers, split, key, 1)


def _language_code(config: Config, tokenizers: TokenizerPair, split: SplitConfig, key: str, side: int) -> int | None:
    """The id of the code of a corpus's source (`side` 0) or target (1) language, named as --src-lang and --tgt-lang
    name them; None without codes."""
    if config.data.lang_tag != "code":
        return None
    field = ("src_lang", "tgt_lang")[side]
    named = f"{key}.{field}" if getattr(split, field) else field
    return recipe_code_id(tokenizers.src.codes, split_languages(config, split)[side], key=named)


def _language_tag(config: Config, tokenizers: TokenizerPair, split: SplitConfig, key: str) -> int | None:
    if config.data.lang_tag == "code":
        return _language_code(config, tokenizers, split, key, 0)
    if config.data.lang_tag != "target":
        return None
    lang = split_languages(config, split)[1]
    if lang not in tokenizers.src.tags:
        reserved = ", ".join(tokenizers.src.tags) or "none"
        raise MtkitError(
            f"{key}: target language {lang!r} has no tag in the tokenizer (tags reserved: {reserved}); tags are "
            "reserved when the tokenizer is trained: run `mtkit tokenizer train RECIPE` again (list languages to be "
            "added later in data.langs)"
        )
    return tokenizers.src.tags[lang]


def _pairs(config: Config, key: str, split: SplitConfig, *, max_chars: int | None = None) -> Iterator[Pair]:
    normalize, bad_bytes = config.data.normalize, config.data.bad_bytes
    src_lang, tgt_lang = split_languages(config, split)
    return iter_split(
        split, src_lang, tgt_lang=tgt_lang, normalize=normalize, recipe_key=key, bad_bytes=bad_bytes, max_chars=max_chars
    )
