"""Tests for mtkit.data.corpora: every corpus reader, normalization, the one-line errors and the cleaning rules."""

from __future__ import annotations

import gzip
import itertools
import json
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtkit.config import DataConfig, SplitConfig
from mtkit.data.corpora import CleanReport, DroppedPair, character_cap, clean_pairs, clean_table, iter_split
from mtkit.errors import MtkitError


def read_split(split: SplitConfig, src_lang: str, tgt_lang: str, **options) -> list:
    """A whole split, as a list."""
    return list(iter_split(split, src_lang, tgt_lang=tgt_lang, **options))


PAIRS = [("Ein Hund läuft.", "A dog runs."), ("Zwei Männer  lachen.", "Two men  laugh.")]


def gold_multi30k(directory: Path, split: str, count: int) -> list[tuple[str, str]]:
    """The first `count` Multi30k pairs, read independently of mtkit."""
    sides = []
    for lang in ("de", "en"):
        with gzip.open(directory / f"{split}.{lang}.gz", "rt", encoding="utf-8") as handle:
            sides.append([line.strip() for line in itertools.islice(handle, count)])
    return list(zip(*sides, strict=True))


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def write_parallel(tmp_path: Path, src_text: str, tgt_text: str, suffix: str = "") -> SplitConfig:
    src = write_bytes(tmp_path / f"corpus.de{suffix}", src_text.encode("utf-8"))
    tgt = write_bytes(tmp_path / f"corpus.en{suffix}", tgt_text.encode("utf-8"))
    return SplitConfig(src=str(src), tgt=str(tgt))


def read_error(split: SplitConfig, **options: str) -> str:
    """The message of the MtkitError that reading `split` raises, checked to be one line."""
    with pytest.raises(MtkitError) as caught:
        read_split(split, "de", "en", **options)
    message = str(caught.value)
    assert "\n" not in message
    return message


# Readers


def test_plain_text_files_match_multi30k(multi30k_dir, multi30k_slice):
    split = SplitConfig(src=str(multi30k_slice("train", "de", 300)), tgt=str(multi30k_slice("train", "en", 300)))
    assert read_split(split, "de", "en") == gold_multi30k(multi30k_dir, "train", 300)


def test_gzip_files_are_read_transparently_and_limit_keeps_the_first_pairs(multi30k_dir):
    split = SplitConfig(src=str(multi30k_dir / "val.de.gz"), tgt=str(multi30k_dir / "val.en.gz"), limit=200)
    pairs = read_split(split, "de", "en")
    assert len(pairs) == 200
    assert pairs == gold_multi30k(multi30k_dir, "val", 200)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_tsv(tmp_path, suffix):
    text = "".join(f"{src}\t{tgt}\n" for src, tgt in PAIRS)
    path = write_bytes(tmp_path / f"corpus.tsv{suffix}", text.encode("utf-8"))
    assert read_split(SplitConfig(tsv=str(path)), "de", "en") == PAIRS


def test_tsv_keeps_an_empty_side(tmp_path):
    path = write_bytes(tmp_path / "corpus.tsv", b"\tA dog.\nEin Hund.\t\n")
    assert read_split(SplitConfig(tsv=str(path)), "de", "en") == [("", "A dog."), ("Ein Hund.", "")]


@pytest.mark.parametrize("nested", [False, True], ids=["language-keys", "translation-object"])
def test_jsonl_both_shapes(tmp_path, nested):
    rows = [{"de": src, "en": tgt, "id": number} for number, (src, tgt) in enumerate(PAIRS)]
    if nested:
        rows = [{"translation": {"de": row["de"], "en": row["en"]}} for row in rows]
    text = "\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n\n"
    path = write_bytes(tmp_path / "corpus.jsonl", text.encode("utf-8"))
    assert read_split(SplitConfig(jsonl=str(path)), "de", "en") == PAIRS


@pytest.fixture(scope="module")
def datasets():
    """Hugging Face datasets, imported by the tests that use it (a second to import: not at collection)."""
    import datasets

    return datasets


def test_hf_dataset_with_one_column_per_language(tmp_path, datasets):
    directory = tmp_path / "hf"
    datasets.Dataset.from_dict({"en": [t for _, t in PAIRS], "de": [s for s, _ in PAIRS]}).save_to_disk(str(directory))
    assert read_split(SplitConfig(hf=str(directory)), "de", "en") == PAIRS


def test_hf_dataset_dict_with_translation_column_picks_the_split(tmp_path, datasets):
    directory = tmp_path / "hf"
    rows = [{"de": src, "en": tgt} for src, tgt in PAIRS]
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"translation": rows}),
            "validation": datasets.Dataset.from_dict({"translation": rows[:1]}),
        }
    ).save_to_disk(str(directory))
    assert read_split(SplitConfig(hf=str(directory), split="validation"), "de", "en") == PAIRS[:1]
    assert read_split(SplitConfig(hf=str(directory), split="train", limit=1), "de", "en") == PAIRS[:1]
    assert read_split(SplitConfig(hf=str(directory), split="train"), "de", "en") == PAIRS


def test_hf_hub_failure_explains_how_to_use_local_files(monkeypatch, datasets):
    def unreachable(name: str, split: str) -> None:
        raise ConnectionError("Couldn't reach 'bentrevett/multi30k' on the Hub\n(offline)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    message = read_error(SplitConfig(hf="bentrevett/multi30k", split="train"))
    assert "bentrevett/multi30k" in message
    assert "could not be loaded" in message
    assert "unreachable" in message
    assert "src/tgt" in message


@pytest.mark.parametrize("kind", ["plain", "tsv", "jsonl"])
def test_limit_applies_to_every_reader(tmp_path, kind):
    lines = [(f"satz {number}", f"sentence {number}") for number in range(10)]
    if kind == "plain":
        split = write_parallel(tmp_path, "".join(f"{s}\n" for s, _ in lines), "".join(f"{t}\n" for _, t in lines))
    elif kind == "tsv":
        split = SplitConfig(tsv=str(write_bytes(tmp_path / "c.tsv", "".join(f"{s}\t{t}\n" for s, t in lines).encode())))
    else:
        text = "".join(json.dumps({"de": s, "en": t}) + "\n" for s, t in lines)
        split = SplitConfig(jsonl=str(write_bytes(tmp_path / "c.jsonl", text.encode())))
    split.limit = 3
    assert read_split(split, "de", "en") == lines[:3]


# Line endings, byte-order mark, whitespace and normalization


def test_crlf_bom_and_outer_whitespace_are_stripped_inner_whitespace_kept(tmp_path):
    split = write_parallel(tmp_path, "\ufeffEin  Hund.\r\n  Eine Katze. \r\n", "\ufeffA  dog.\r\nA cat.\t\r\n", ".gz")
    assert read_split(split, "de", "en") == [("Ein  Hund.", "A  dog."), ("Eine Katze.", "A cat.")]


def test_bom_is_stripped_in_tsv_and_jsonl(tmp_path):
    tsv = write_bytes(tmp_path / "c.tsv", "\ufeffHund\tdog\r\n".encode())
    jsonl = write_bytes(tmp_path / "c.jsonl", ('\ufeff{"de": "Hund", "en": "dog"}\r\n').encode())
    assert read_split(SplitConfig(tsv=str(tsv)), "de", "en") == [("Hund", "dog")]
    assert read_split(SplitConfig(jsonl=str(jsonl)), "de", "en") == [("Hund", "dog")]


@pytest.mark.parametrize(
    ("form", "expected"),
    [
        ("NFC", "Männer ﬁnden"),
        ("NFKC", "Männer finden"),
        ("none", unicodedata.normalize("NFD", "Männer ﬁnden")),
    ],
)
def test_normalization(tmp_path, form, expected):
    decomposed = unicodedata.normalize("NFD", "Männer ﬁnden")
    assert decomposed != "Männer ﬁnden"
    split = write_parallel(tmp_path, decomposed + "\n", decomposed + "\n")
    assert read_split(split, "de", "en", normalize=form) == [(expected, expected)]


def test_hf_rows_are_normalized(tmp_path, datasets):
    directory = tmp_path / "hf"
    decomposed = unicodedata.normalize("NFD", " Mädchen ")
    datasets.Dataset.from_dict({"de": [decomposed], "en": ["girl"]}).save_to_disk(str(directory))
    assert read_split(SplitConfig(hf=str(directory)), "de", "en") == [("Mädchen", "girl")]


# One-line errors that name the file, the line and the fix


def test_missing_file_names_the_file_and_the_recipe_key(tmp_path):
    split = SplitConfig(src=str(tmp_path / "x.de"), tgt=str(tmp_path / "x.en"))
    message = read_error(split)
    assert message == f"{tmp_path / 'x.de'}: file not found; check data.<split>.src in the recipe"
    split.src = str(write_bytes(tmp_path / "x.de", b"Hund\n"))
    message = read_error(split, recipe_key="data.train")
    assert message == f"{tmp_path / 'x.en'}: file not found; check data.train.tgt in the recipe"


@pytest.mark.parametrize(("src_lines", "tgt_lines"), [(10, 9), (9, 10)])
def test_mismatched_line_counts(tmp_path, src_lines, tgt_lines):
    split = write_parallel(tmp_path, "Hund\n" * src_lines, "dog\n" * tgt_lines)
    message = read_error(split)
    assert message == (
        f"{split.src} has {src_lines} lines but {split.tgt} has {tgt_lines}; parallel files must have the same number of lines"
    )


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_invalid_utf8_names_line_byte_and_column(tmp_path, suffix):
    src = write_bytes(tmp_path / f"x.de{suffix}", b"Hund\nKatze\nM\xc3\xa4u\xffse\n")  # 0xff is the 4th character
    tgt = write_bytes(tmp_path / f"x.en{suffix}", b"dog\ncat\nmice\n")
    message = read_error(SplitConfig(src=str(src), tgt=str(tgt)))
    assert message == f"{src}:3: not valid UTF-8 (byte 0xff at column 4); convert the file to UTF-8 or set data.bad_bytes=replace"


@pytest.mark.parametrize("content", [b"not gzip at all\n", gzip.compress(b"Hund\n" * 100)[:-12]], ids=["not-gzip", "truncated"])
def test_damaged_gzip_file(tmp_path, content):
    src = tmp_path / "x.de.gz"
    src.write_bytes(content)
    tgt = write_bytes(tmp_path / "x.en", b"dog\n")
    message = read_error(SplitConfig(src=str(src), tgt=str(tgt)))
    assert message.startswith(f"{src}: damaged gzip file")


def test_tsv_line_without_a_tab(tmp_path):
    path = write_bytes(tmp_path / "c.tsv", b"Hund\tdog\nKatze cat\n")
    message = read_error(SplitConfig(tsv=str(path)))
    assert message.startswith(f"{path}:2: expected 'source<TAB>target' but found 0 tabs")


def test_tsv_line_with_two_tabs(tmp_path):
    path = write_bytes(tmp_path / "c.tsv", b"Hund\tdog\t0.9\n")
    assert read_error(SplitConfig(tsv=str(path))).startswith(f"{path}:1: expected 'source<TAB>target' but found 2 tabs")


def test_bad_json(tmp_path):
    path = write_bytes(tmp_path / "c.jsonl", b'{"de": "Hund", "en": "dog"}\n{"de": "Katze", "en": \n')
    message = read_error(SplitConfig(jsonl=str(path)))
    assert message.startswith(f"{path}:2: not valid JSON")
    assert "one JSON object per line" in message


@pytest.mark.parametrize(
    ("row", "found"),
    [
        ({"de": "Hund", "fr": "chien"}, "found de, fr"),
        ({"translation": {"de": "Hund"}}, "found de"),
        (["Hund", "dog"], "found list"),
    ],
)
def test_json_without_the_language_keys(tmp_path, row, found):
    path = write_bytes(tmp_path / "c.jsonl", (json.dumps({"de": "a", "en": "b"}) + "\n" + json.dumps(row) + "\n").encode())
    message = read_error(SplitConfig(jsonl=str(path)))
    assert message.startswith(f"{path}:2: expected keys 'de' and 'en'")
    assert found in message


def test_json_value_that_is_not_a_string(tmp_path):
    path = write_bytes(tmp_path / "c.jsonl", b'{"de": "Hund", "en": 3}\n')
    assert read_error(SplitConfig(jsonl=str(path))).startswith(f"{path}:1: 'de' and 'en' must be strings")


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        (SplitConfig(), "data.<split>: set exactly one source: src and tgt, tsv, jsonl, tmx or hf (found none)"),
        (
            SplitConfig(tsv="a.tsv", hf="b"),
            "data.<split>: set exactly one source: src and tgt, tsv, jsonl, tmx or hf (found tsv and hf)",
        ),
        (SplitConfig(src="a.de"), "data.<split>.src is set but data.<split>.tgt is not; set both (one file per language)"),
        (SplitConfig(src="a", tgt="b", limit=0), "data.<split>.limit is 0; give a positive number of pairs or leave it unset"),
        (
            SplitConfig(hf="bentrevett/multi30k"),
            "data.<split>.split is not set; name the split of bentrevett/multi30k to read (train, validation, ...)",
        ),
    ],
)
def test_source_kind_and_limit_errors(split, expected):
    assert read_error(split) == expected


def test_unknown_normalization_form(tmp_path):
    split = write_parallel(tmp_path, "a\n", "b\n")
    assert read_error(split, normalize="NFD") == "data.normalize is 'NFD'; choose one of NFC, NFKC, none"


def test_hf_missing_columns_are_named(tmp_path, datasets):
    directory = tmp_path / "hf"
    datasets.Dataset.from_dict({"german": ["Hund"], "english": ["dog"]}).save_to_disk(str(directory))
    message = read_error(SplitConfig(hf=str(directory)))
    assert message.startswith(f"{directory}: no columns 'de' and 'en' nor 'translation'")
    assert "columns german, english" in message


def test_hf_translation_row_without_the_language(tmp_path, datasets):
    directory = tmp_path / "hf"
    rows = [{"de": "Hund", "fr": "chien"}, {"de": "Katze", "fr": "chat"}]
    datasets.Dataset.from_dict({"translation": rows}).save_to_disk(str(directory))
    message = read_error(SplitConfig(hf=str(directory)))
    assert message.startswith(f"{directory}: row 1: expected keys 'de' and 'en'")
    assert "found de, fr" in message


def test_hf_dataset_dict_needs_an_existing_split(tmp_path, datasets):
    directory = tmp_path / "hf"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"de": ["a"], "en": ["b"]}),
            "test": datasets.Dataset.from_dict({"de": ["c"], "en": ["d"]}),
        }
    ).save_to_disk(str(directory))
    assert read_error(SplitConfig(hf=str(directory))) == (
        f"{directory}: the dataset has splits train, test; set data.<split>.split to one of them"
    )
    assert read_error(SplitConfig(hf=str(directory), split="validation")) == (
        f"{directory}: no split 'validation'; set data.<split>.split to one of train, test"
    )


def test_hf_directory_that_is_not_a_dataset(tmp_path):
    message = read_error(SplitConfig(hf=str(tmp_path)))
    assert message.startswith(f"{tmp_path}: not a dataset saved with save_to_disk")


# Cleaning


def clean_config(**changes: object) -> DataConfig:
    return DataConfig(max_len=5, max_ratio=2.0, **changes)


def test_each_rule_removes_and_counts_its_pairs():
    pairs = [
        ("ein Hund", "a dog"),  # kept
        ("   ", "a dog"),  # empty (after strip)
        ("ein Hund", ""),  # empty
        ("a b c d e f", "a b c"),  # too_long: 6 > max_len 5
        ("ein", "a big dog"),  # ratio: 3 / 1 > 2.0
        ("Hallo Welt", "Hallo Welt"),  # copy
        ("ein Hund", "a dog"),  # duplicate
        ("zwei Hunde", "two dogs"),  # kept
    ]
    kept, report = clean_pairs(pairs, clean_config())
    assert kept == [("ein Hund", "a dog"), ("zwei Hunde", "two dogs")]
    assert report == CleanReport(total=8, empty=2, too_long=1, ratio=1, duplicate=1, copy=1, kept=2)


def test_boundaries_are_kept():
    pairs = [("a b c d e", "a b c"), ("a b", "a b c d")]  # exactly max_len, exactly max_ratio
    kept, report = clean_pairs(pairs, clean_config())
    assert kept == pairs
    assert report.kept == 2


def test_a_side_of_more_characters_than_the_cap_is_too_long_however_few_its_words():
    _, report = clean_pairs([("x" * 10_000_000, "y" * 10_000_000)], DataConfig())  # one word a side: passes max_len
    assert report.too_long == 1 and report.kept == 0
    cap = character_cap(clean_config())
    pairs = [("x" * cap, "y"), ("x" * (cap + 1), "y"), ("a", "y" * (cap + 1))]  # at the cap, over it on each side
    kept, report = clean_pairs(pairs, clean_config())
    assert kept == pairs[:1] and report.too_long == 2


def test_a_training_side_over_the_cap_is_cut_as_it_is_read_and_not_normalized(tmp_path):
    long, decomposed = "e\u0301" * 40, "Cafe\u0301"
    split = write_parallel(tmp_path, f"{long}\n{decomposed}\n", "x\ny\n")
    assert read_split(split, "de", "en", max_chars=10) == [(long[:11], "x"), (unicodedata.normalize("NFC", decomposed), "y")]
    assert read_split(split, "de", "en")[0] == (unicodedata.normalize("NFC", long), "x")  # no cap: read whole


def test_a_dropped_pair_is_one_line_of_five_fields_whatever_line_breaks_its_text_holds():
    breaks = "\t\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
    line = DroppedPair(corpus="crawl", rule="langid", why="target fr", pair=(f"a{breaks}b", "c\r\nd")).line()
    assert len(line.splitlines()) == 1 and line.endswith("\n")
    assert line.rstrip("\n").split("\t") == ["crawl", "langid", "target fr", "a" + " " * len(breaks) + "b", "c  d"]


def test_each_pair_is_counted_under_the_first_rule_only():
    pairs = [
        ("", "a b c d e f g"),  # empty and too long -> empty
        ("a b c d e f g", "a"),  # too long and bad ratio -> too_long
        ("a a a a a", "a a"),  # bad ratio and a repeat of nothing -> ratio
        ("x", "x"),
        ("x", "x"),  # copy, then copy again (never counted as duplicate)
    ]
    _, report = clean_pairs(pairs, clean_config())
    assert (report.empty, report.too_long, report.ratio, report.copy, report.duplicate) == (1, 1, 1, 2, 0)


def test_copies_and_duplicates_can_be_kept():
    pairs = [("Hallo", "Hallo"), ("Hund", "dog"), ("Hund", "dog")]
    kept, report = clean_pairs(pairs, clean_config(drop_copies=False, dedup=False))
    assert kept == pairs
    assert report.copy == report.duplicate == 0


def test_duplicate_needs_both_sides_equal():
    pairs = [("Hund", "dog"), ("Hund", "hound"), ("Hund", "dog")]
    kept, report = clean_pairs(pairs, clean_config())
    assert kept == pairs[:2]
    assert report.duplicate == 1


def test_cleaning_real_multi30k_slice_drops_nothing_but_duplicates(multi30k_dir):
    pairs = gold_multi30k(multi30k_dir, "train", 500)
    kept, report = clean_pairs(pairs + pairs[:20], DataConfig())
    assert kept == pairs
    assert report.to_dict() == {"total": 520, "empty": 0, "too_long": 0, "ratio": 0, "duplicate": 20, "copy": 0, "kept": 500}


def test_clean_table_has_a_column_per_corpus_and_a_total():
    news = CleanReport(total=10, empty=1, too_long=2, ratio=0, duplicate=3, copy=0, kept=4).to_dict()
    crawl = CleanReport(total=5, empty=0, too_long=0, ratio=1, duplicate=0, copy=1, kept=3).to_dict()
    lines = clean_table({"news": news, "crawl": crawl}).splitlines()
    assert [line.split() for line in lines] == [
        ["removed", "by", "news", "crawl", "total"],
        ["empty", "1", "0", "1"],
        ["too_long", "2", "0", "2"],
        ["ratio", "0", "1", "1"],
        ["copy", "0", "1", "1"],
        ["duplicate", "3", "0", "3"],
        ["kept", "4", "3", "7"],
        ["total", "10", "5", "15"],
    ]
    assert [line.split() for line in clean_table({"news": news}).splitlines()][0] == ["removed", "by", "news"]


sentences = st.text(alphabet="ab ", max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(sentences, sentences), max_size=30), st.booleans(), st.booleans())
def test_every_pair_is_kept_or_counted_once(pairs, dedup, drop_copies):
    kept, report = clean_pairs(pairs, DataConfig(max_len=4, max_ratio=2.0, dedup=dedup, drop_copies=drop_copies))
    removed = report.empty + report.too_long + report.ratio + report.duplicate + report.copy
    assert report.total == len(pairs) == removed + report.kept
    assert report.kept == len(kept)
    remaining = iter(pairs)
    assert all(pair in remaining for pair in kept)  # kept pairs appear in their original order
    if dedup:
        assert len(set(kept)) == len(kept)


def test_bad_bytes_can_be_replaced_and_counted(tmp_path, capsys):
    src, tgt = tmp_path / "bad.de", tmp_path / "bad.en"
    src.write_bytes(b"gut\nschlecht \xff hier\nauch \xfe\xfe\n")
    tgt.write_bytes(b"good\nbad here\nalso\n")
    pairs = read_split(SplitConfig(src=str(src), tgt=str(tgt)), "de", "en", bad_bytes="replace")
    assert [s for s, _ in pairs] == ["gut", "schlecht \ufffd hier", "auch \ufffd\ufffd"]
    assert "bad.de: replaced bytes that are not UTF-8 on 2 lines" in capsys.readouterr().err
    with pytest.raises(MtkitError, match=r"bad\.de:2: .*data\.bad_bytes=replace"):
        read_split(SplitConfig(src=str(src), tgt=str(tgt)), "de", "en")
