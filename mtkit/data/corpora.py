"""Reading parallel corpora (text, TSV, JSONL, TMX, Hugging Face datasets) and cleaning the training pairs.

`iter_split` turns one `SplitConfig` into normalized (source, target) pairs and reports any bad
file, line or column as a one-line `MtkitError`; `clean_pairs` applies the recipe's filters and
counts what each rule removed in a `CleanReport`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mtkit.config import DataConfig, SplitConfig, TrainSource, choices
from mtkit.data.dedup import SeenHashes, pair_hashes
from mtkit.data.tmx import read_tmx
from mtkit.errors import MtkitError, one_line
from mtkit.textio import file_lines, model_text

Pair = tuple[str, str]

PROGRESS_MIN_BYTES = 4_000_000  # roughly 100k lines: smaller files are read without a progress bar
# A training side may hold this many characters per word data.max_len allows: far more than the words of a sentence
# take, so only a line that is no sentence (a page without spaces, an encoded blob) reaches it, and no model reads it
CHARACTERS_PER_WORD = 20
# What Python's str.splitlines ends a line at: each becomes a space in a one-line field, so no reader sees a new row
_LINE_BREAKS = str.maketrans(dict.fromkeys("\t\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029", " "))


def iter_split(
    split: SplitConfig,
    src_lang: str,
    *,
    tgt_lang: str,
    normalize: str = "NFC",
    recipe_key: str = "data.<split>",
    bad_bytes: str = "error",
    max_chars: int | None = None,
) -> Iterator[Pair]:
    """The sentence pairs of one split, normalized and stripped, read lazily, at most `split.limit` of them.

    The split's settings are checked before the first pair. Reading stops after `split.limit`
    pairs, so parallel files are only checked that far. `recipe_key` (such as "data.train") names
    the split in error messages. `bad_bytes="replace"` replaces bytes that are not UTF-8 (and warns
    with the count of lines) instead of stopping. `list(iter_split(...))` reads a whole split.
    With `max_chars` (the training split's `character_cap`), a pair with a longer side comes cut to
    `max_chars + 1` characters a side and not normalized: the cleaner drops it as too long, and
    neither normalization nor a chunk of pairs holds the rest of it.
    """
    if normalize not in choices(DataConfig, "normalize"):
        raise MtkitError(f"data.normalize is {normalize!r}; choose one of {', '.join(choices(DataConfig, 'normalize'))}")
    if split.limit is not None and split.limit < 1:
        raise MtkitError(f"{recipe_key}.limit is {split.limit}; give a positive number of pairs or leave it unset")
    kind = _source_kind(split, recipe_key)
    if kind == "src/tgt":
        raw_pairs = _read_parallel_files(Path(split.src), Path(split.tgt), recipe_key, bad_bytes)
    elif kind == "tsv":
        raw_pairs = _read_tsv(Path(split.tsv), f"{recipe_key}.tsv", bad_bytes)
    elif kind == "jsonl":
        raw_pairs = _read_jsonl(Path(split.jsonl), src_lang, tgt_lang, f"{recipe_key}.jsonl", bad_bytes)
    elif kind == "tmx":
        raw_pairs = read_tmx(Path(split.tmx), src_lang, tgt_lang=tgt_lang, recipe_key=f"{recipe_key}.tmx")
    else:
        raw_pairs = _read_hf(split, src_lang, tgt_lang, recipe_key)
    return (_model_pair(pair, normalize, max_chars) for pair in itertools.islice(raw_pairs, split.limit))


def character_cap(config: DataConfig) -> int:
    """The most characters a training side may hold (`CHARACTERS_PER_WORD` a word of `data.max_len`)."""
    return config.max_len * CHARACTERS_PER_WORD


def _model_pair(pair: Pair, normalize: str, max_chars: int | None) -> Pair:
    """A pair as the model reads it; see `iter_split` for `max_chars`."""
    src, tgt = pair
    if max_chars is not None and max(len(src), len(tgt)) > max_chars:
        return src[: max_chars + 1], tgt[: max_chars + 1]
    return model_text(src, normalize), model_text(tgt, normalize)


def iter_side(path: Path, normalize: str, *, limit: int | None, recipe_key: str, bad_bytes: str = "error") -> Iterator[str]:
    """The normalized lines of one side's text file (a synthetic corpus's given side), at most `limit` of them."""
    lines = (model_text(text, normalize) for _, text in _read_lines(path, recipe_key, bad_bytes))
    return itertools.islice(lines, limit)


def corpus_names(sources: list[TrainSource]) -> list[str]:
    """Each training corpus's name: its `name`, else its file (or dataset) name, numbered when repeated."""
    names = []
    for source in sources:
        file = source.src or source.tgt or source.tsv or source.jsonl or source.tmx or ""  # tgt alone: a back-translated corpus
        given = source.name or Path(file).name.removesuffix(".gz") or source.hf
        names.append(given or "train")
    return [name if names.count(name) == 1 else f"{name}#{names[: index + 1].count(name)}" for index, name in enumerate(names)]


def _source_kind(split: SplitConfig, recipe_key: str) -> str:
    if (split.src is None) != (split.tgt is None):
        given, missing = ("src", "tgt") if split.tgt is None else ("tgt", "src")
        raise MtkitError(f"{recipe_key}.{given} is set but {recipe_key}.{missing} is not; set both (one file per language)")
    kinds = [
        name
        for name, value in (
            ("src/tgt", split.src),
            ("tsv", split.tsv),
            ("jsonl", split.jsonl),
            ("tmx", split.tmx),
            ("hf", split.hf),
        )
        if value is not None
    ]
    if len(kinds) != 1:
        found = " and ".join(kinds) if kinds else "none"
        raise MtkitError(f"{recipe_key}: set exactly one source: src and tgt, tsv, jsonl, tmx or hf (found {found})")
    return kinds[0]


def _read_lines(path: Path, recipe_key: str, bad_bytes: str = "error") -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, text) without the line ending and the file's byte-order mark."""
    if not path.is_file():
        raise MtkitError(f"{path}: file not found; check {recipe_key} in the recipe")
    progress = sys.stderr.isatty() and path.stat().st_size >= PROGRESS_MIN_BYTES
    return file_lines(path, bad_bytes, fix=" or set data.bad_bytes=replace", progress=progress)


def _read_parallel_files(src_path: Path, tgt_path: Path, recipe_key: str, bad_bytes: str) -> Iterator[Pair]:
    src_lines = _read_lines(src_path, f"{recipe_key}.src", bad_bytes)
    tgt_lines = _read_lines(tgt_path, f"{recipe_key}.tgt", bad_bytes)
    for count, (src_item, tgt_item) in enumerate(itertools.zip_longest(src_lines, tgt_lines)):
        if src_item is None or tgt_item is None:
            # One file ended early: count the rest of the other to say how long each is.
            src_count = count + (src_item is not None) + sum(1 for _ in src_lines)
            tgt_count = count + (tgt_item is not None) + sum(1 for _ in tgt_lines)
            raise MtkitError(
                f"{src_path} has {src_count} lines but {tgt_path} has {tgt_count}; "
                "parallel files must have the same number of lines"
            )
        yield src_item[1], tgt_item[1]


def _read_tsv(path: Path, recipe_key: str, bad_bytes: str) -> Iterator[Pair]:
    for number, line in _read_lines(path, recipe_key, bad_bytes):
        fields = line.split("\t")
        if len(fields) != 2:
            raise MtkitError(
                f"{path}:{number}: expected 'source<TAB>target' but found {len(fields) - 1} tabs; "
                "write one tab-separated pair per line"
            )
        yield fields[0], fields[1]


def _read_jsonl(path: Path, src_lang: str, tgt_lang: str, recipe_key: str, bad_bytes: str) -> Iterator[Pair]:
    """Yield pairs from JSON objects, one a line; blank lines are skipped."""
    for number, line in _read_lines(path, recipe_key, bad_bytes):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise MtkitError(
                f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno}); write one JSON object per line"
            ) from None
        yield _pair_from_row(row, src_lang, tgt_lang, f"{path}:{number}")


def _pair_from_row(row: Any, src_lang: str, tgt_lang: str, where: str) -> Pair:
    """The pair in {src_lang: .., tgt_lang: ..} or {"translation": {src_lang: .., tgt_lang: ..}}."""
    if isinstance(row, dict) and isinstance(row.get("translation"), dict):
        row = row["translation"]
    if not isinstance(row, dict) or src_lang not in row or tgt_lang not in row:
        found = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
        raise MtkitError(
            f"{where}: expected keys '{src_lang}' and '{tgt_lang}' (or a 'translation' object "
            f"with them) but found {found or 'no keys'}; check src_lang and tgt_lang in the recipe"
        )
    src, tgt = row[src_lang], row[tgt_lang]
    if not isinstance(src, str) or not isinstance(tgt, str):
        raise MtkitError(f"{where}: '{src_lang}' and '{tgt_lang}' must be strings; fix the corpus")
    return src, tgt


def _read_hf(split: SplitConfig, src_lang: str, tgt_lang: str, recipe_key: str) -> Iterator[Pair]:
    dataset = _load_hf(split, recipe_key)
    if split.limit is not None:
        dataset = dataset.select(range(min(split.limit, len(dataset))))
    columns = dataset.column_names
    if src_lang in columns and tgt_lang in columns:
        # A missing value (None) becomes an empty sentence, which cleaning then drops.
        yield from ((src or "", tgt or "") for src, tgt in zip(dataset[src_lang], dataset[tgt_lang], strict=True))
    elif "translation" in columns:
        for number, row in enumerate(dataset["translation"], start=1):
            yield _pair_from_row(row, src_lang, tgt_lang, f"{split.hf}: row {number}")
    else:
        raise MtkitError(
            f"{split.hf}: no columns '{src_lang}' and '{tgt_lang}' nor 'translation'; the dataset has "
            f"columns {', '.join(columns)}; set src_lang and tgt_lang in the recipe to match"
        )


def _load_hf(split: SplitConfig, recipe_key: str) -> Any:
    """The `datasets.Dataset` of a save_to_disk directory or of a hub name."""
    import datasets  # slow to import: only when a recipe reads a Hugging Face dataset

    if not Path(split.hf).is_dir():
        return _load_hub(split, recipe_key)
    try:
        loaded = datasets.load_from_disk(split.hf)
    except FileNotFoundError:
        raise MtkitError(f"{split.hf}: not a dataset saved with save_to_disk; check {recipe_key}.hf in the recipe") from None
    if isinstance(loaded, datasets.Dataset):
        return loaded
    names = ", ".join(loaded)
    if split.split is None:
        raise MtkitError(f"{split.hf}: the dataset has splits {names}; set {recipe_key}.split to one of them")
    if split.split not in loaded:
        raise MtkitError(f"{split.hf}: no split '{split.split}'; set {recipe_key}.split to one of {names}")
    return loaded[split.split]


def _load_hub(split: SplitConfig, recipe_key: str) -> Any:
    import datasets

    if split.split is None:
        raise MtkitError(f"{recipe_key}.split is not set; name the split of {split.hf} to read (train, validation, ...)")
    try:
        return datasets.load_dataset(split.hf, split=split.split)
    except Exception as err:  # noqa: BLE001 - the hub fails in many ways; all mean "use local files"
        reason = one_line(err, limit=200)
        raise MtkitError(
            f"{split.hf}: the Hugging Face dataset could not be loaded ({type(err).__name__}: {reason}); "
            f"the hub may be unreachable; point {recipe_key}.src/tgt at local files instead"
        ) from None


@dataclass(kw_only=True)
class CleanReport:
    """How many training pairs each cleaning rule removed (each pair counted under the first rule); `filters` counts
    the recipe's filter rules (`PairFilter`: langid, dual_xent, qe), only those it sets, so a report without them
    reads as before."""

    total: int = 0
    empty: int = 0
    too_long: int = 0
    ratio: int = 0
    duplicate: int = 0
    copy: int = 0
    kept: int = 0
    filters: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, int]:
        counts = dataclasses.asdict(self)
        filters = counts.pop("filters")
        return {**counts, **filters}

    @classmethod
    def from_dict(cls, counts: dict[str, int]) -> CleanReport:
        """The report `to_dict` gave: the rules' fields, and any other count a filter's."""
        rules = {key: value for key, value in counts.items() if key in cls.__dataclass_fields__}
        return cls(**rules, filters={key: value for key, value in counts.items() if key not in rules})

    @classmethod
    def total_of(cls, reports: list[CleanReport]) -> CleanReport:
        """One report counting what all of `reports` count."""
        fields = [key for key in cls.__dataclass_fields__ if key != "filters"]
        total = cls(**{key: sum(getattr(report, key) for report in reports) for key in fields})
        for report in reports:
            for rule, count in report.filters.items():
                total.filters[rule] = total.filters.get(rule, 0) + count
        return total


def clean_table(reports: dict[str, dict[str, int]]) -> str:
    """What cleaning removed, a column per corpus (`CleanReport.to_dict()` by name) and a total when several."""
    if len(reports) > 1:
        reports = {**reports, "total": CleanReport.total_of([CleanReport.from_dict(r) for r in reports.values()]).to_dict()}
    width = max(9, *(len(name) for name in reports))
    filters = list(dict.fromkeys(key for report in reports.values() for key in CleanReport.from_dict(report).filters))
    rows = ["empty", "too_long", "ratio", "copy", "duplicate", *filters, "kept", "total"]  # in the order the rules apply
    lines = [f"{'removed by':<10}" + "".join(f" {name:>{width}}" for name in reports)]
    lines += [f"{row:<10}" + "".join(f" {report.get(row, 0):>{width}}" for report in reports.values()) for row in rows]
    return "\n".join(lines)


class PairFilter(Protocol):
    """A cleaning rule that judges pairs with a model (`data.langid`, `data.dual_xent_*`, `data.qe_*`), built above
    data by `mtkit.evaluation.filters` and handed to the `Cleaner`; `name` is its row in the cleaning report."""

    name: str

    def drops(self, pairs: list[Pair], languages: tuple[str, str]) -> list[str | None]:
        """Per pair: None to keep it, else why it goes (a score, the language found), written beside the report."""


@dataclass(frozen=True, kw_only=True)
class DroppedPair:
    """A pair a filter rule removed, as `mtkit prepare` lists it in dropped.tsv."""

    corpus: str
    rule: str
    why: str
    pair: Pair

    def line(self) -> str:
        fields = [self.corpus, self.rule, self.why, *self.pair]
        return "\t".join(field.translate(_LINE_BREAKS) for field in fields) + "\n"


class Cleaner:
    """The recipe's cleaning rules over a stream of chunks, counted per report (one per corpus).

    Repeated pairs are found across every chunk given to one `Cleaner` (so across corpora too) by
    a 64-bit hash of the pair, so memory holds 8 bytes per kept pair, not the pairs. The filter rules
    (`filters`) judge what the others keep, in order, so a model never scores a pair already dropped.
    """

    def __init__(self, config: DataConfig, filters: Sequence[PairFilter] = ()) -> None:
        self.config = config
        self.filters = list(filters)
        self.seen = SeenHashes()

    def clean(self, pairs: list[Pair], report: CleanReport, *, languages: tuple[str, str] = ("", ""),
              dropped: list[DroppedPair] | None = None, corpus: str = "train") -> list[Pair]:  # fmt: skip
        """The pairs to keep, in order; `report` counts each removed pair under the first rule it breaks, and
        `dropped` (when given) receives the pairs the filter rules removed, of `corpus` in `languages`."""
        report.total += len(pairs)
        candidates = []
        for pair in pairs:
            rule = _rejecting_rule(pair, self.config)
            if rule is None:
                candidates.append(pair)
            else:
                setattr(report, rule, getattr(report, rule) + 1)
        if self.config.dedup and candidates:
            new = self.seen.add_new(pair_hashes(candidates))
            report.duplicate += len(candidates) - int(new.sum())
            candidates = list(itertools.compress(candidates, new))
        for rule in self.filters:
            verdicts = rule.drops(candidates, languages) if candidates else []
            gone = [
                DroppedPair(corpus=corpus, rule=rule.name, why=why, pair=pair)
                for pair, why in zip(candidates, verdicts, strict=True)
                if why
            ]
            report.filters[rule.name] = report.filters.get(rule.name, 0) + len(gone)
            if dropped is not None:
                dropped += gone
            candidates = [pair for pair, why in zip(candidates, verdicts, strict=True) if not why]
        report.kept += len(candidates)
        return candidates


def clean_pairs(pairs: list[Pair], config: DataConfig) -> tuple[list[Pair], CleanReport]:
    """Drop empty, too long, badly proportioned, copied and repeated pairs of one list; keep the others in order."""
    report = CleanReport()
    return Cleaner(config).clean(list(pairs), report), report


def _rejecting_rule(pair: Pair, config: DataConfig) -> str | None:
    """The first rule other than `duplicate` that removes `pair`, or None. Lengths are whitespace tokens, and a side
    is too long with more words than `max_len` or more characters than `character_cap` (counted first, so a side of
    millions of characters is not split into words)."""
    src, tgt = pair
    if not src.strip() or not tgt.strip():
        return "empty"
    if max(len(src), len(tgt)) > character_cap(config):
        return "too_long"
    src_length, tgt_length = len(src.split()), len(tgt.split())
    if max(src_length, tgt_length) > config.max_len:
        return "too_long"
    if max(src_length, tgt_length) / min(src_length, tgt_length) > config.max_ratio:
        return "ratio"
    if config.drop_copies and src == tgt:
        return "copy"
    return None
