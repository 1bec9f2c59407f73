"""Tests for mtkit.data.prepare: tokenizer training and the Arrow splits written by `prepare_corpus`."""

from __future__ import annotations

import dataclasses
import json
import sys
import unicodedata
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import append_lines, multi30k_recipe

from mtkit.config import TrainSource
from mtkit.data.corpora import character_cap
from mtkit.data.prepare import _chunks, prepare_corpus, train_tokenizers
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import BOS_ID, EOS_ID, UNK_ID
from mtkit.errors import MtkitError

TRAIN_LINES = 1000


# Tokenizers


def test_joint_tokenizer_is_one_model_for_both_languages(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice, joint=True)
    tokenizers = train_tokenizers(config)
    assert tokenizers.joint
    assert sorted(path.name for path in config.data_path.iterdir()) == ["spm.model"]
    assert tokenizers.src.vocab_size <= 300
    for sentence in ("Zwei Männer stehen im Freien.", "Two men are standing outside."):
        ids = tokenizers.src.encode(sentence)
        assert UNK_ID not in ids
        assert tokenizers.tgt.decode(ids) == sentence


def test_separate_tokenizers_are_trained_per_language(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice, joint=False)
    tokenizers = train_tokenizers(config)
    assert not tokenizers.joint
    assert sorted(path.name for path in config.data_path.iterdir()) == ["spm.src.model", "spm.tgt.model"]
    german, english = "Ein Mädchen läuft über die Straße.", "A girl runs across the street."
    assert tokenizers.src.decode(tokenizers.src.encode(german)) == german
    assert tokenizers.tgt.decode(tokenizers.tgt.encode(english)) == english
    # Each model is fitted to its language: it needs fewer pieces for it than the other model does.
    assert len(tokenizers.src.encode(german)) < len(tokenizers.tgt.encode(german))
    assert len(tokenizers.tgt.encode(english)) < len(tokenizers.src.encode(english))


def test_tokenizer_training_is_reproducible(tmp_path, multi30k_slice):
    first = train_tokenizers(multi30k_recipe(tmp_path / "a", multi30k_slice))
    second = train_tokenizers(multi30k_recipe(tmp_path / "b", multi30k_slice))
    assert first.src.model_proto == second.src.model_proto


# Prepared splits


def test_prepare_writes_arrow_splits_whose_ids_decode_to_the_text(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice)
    tokenizers = train_tokenizers(config)
    report = prepare_corpus(config)
    import datasets  # a second to import: not at collection

    for name, expected_pairs in (("train", TRAIN_LINES), ("valid", 100), ("test", 100)):
        dataset = load_prepared(config.data_path, name)
        assert dataset.table.schema.field("src_ids").type == dataset.table.schema.field("tgt_ids").type == pa.list_(pa.int32())
        # an Arrow stream file that Hugging Face datasets opens as it is
        assert datasets.Dataset.from_file(str(config.data_path / name / "data.arrow"))[:] == dataset[:]
        corpus = ["corpus"] if name == "train" else []  # which training corpus each pair came from
        assert dataset.column_names == ["src", "tgt", "src_ids", "tgt_ids", *corpus]
        assert len(dataset) == expected_pairs == report["splits"][name]["pairs"]
        rows = dataset[:]
        assert report["splits"][name]["src_tokens"] == sum(map(len, rows["src_ids"]))
        assert report["splits"][name]["tgt_tokens"] == sum(map(len, rows["tgt_ids"]))
        assert_ids_decode_to_text(rows, tokenizers.src)


def assert_ids_decode_to_text(rows: dict[str, list], tokenizer) -> None:
    """Ids carry no BOS/EOS and decode back to the stored text (sentences with unknown pieces aside).

    SentencePiece squeezes runs of spaces (a few Multi30k sentences have "am  hohen"), so the
    comparison does too; the stored text keeps them.
    """
    checked = 0
    for side in ("src", "tgt"):
        for text, ids in zip(rows[side], rows[f"{side}_ids"], strict=True):
            assert BOS_ID not in ids and EOS_ID not in ids
            if UNK_ID not in ids:
                assert tokenizer.decode(ids) == " ".join(text.split())
                checked += 1
    assert checked > len(rows["src"])  # most sentences of both sides were compared


def test_prepare_cleans_only_the_training_split_and_writes_the_report(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice)
    first_pair = (
        Path(config.data.train[0].src).read_text().splitlines()[0],
        Path(config.data.train[0].tgt).read_text().splitlines()[0],
    )
    append_lines(Path(config.data.train[0].src), [first_pair[0], "", "Hallo"])
    append_lines(Path(config.data.train[0].tgt), [first_pair[1], "Hello", "Hallo"])
    append_lines(Path(config.data.valid[0].src), [""])  # an empty valid pair is kept: only train is cleaned
    append_lines(Path(config.data.valid[0].tgt), ["An empty source."])
    train_tokenizers(config)
    report = prepare_corpus(config)
    assert report["clean"] == {
        "total": TRAIN_LINES + 3,
        "empty": 1,
        "too_long": 0,
        "ratio": 0,
        "duplicate": 1,
        "copy": 1,
        "kept": TRAIN_LINES,
    }
    assert report["splits"]["valid"]["pairs"] == 101
    assert load_prepared(config.data_path, "valid")[-1]["src"] == ""
    saved = json.loads((config.data_path / "prepare_report.json").read_text(encoding="utf-8"))
    assert saved == report


def test_prepared_text_is_normalized(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice, with_test=False)
    decomposed = unicodedata.normalize("NFD", "Ein Mädchen übt.")
    append_lines(Path(config.data.valid[0].src), [decomposed])
    append_lines(Path(config.data.valid[0].tgt), ["A girl practises."])
    tokenizers = train_tokenizers(config)
    prepare_corpus(config)
    last = load_prepared(config.data_path, "valid")[-1]
    assert last["src"] == "Ein Mädchen übt."
    assert last["src_ids"] == tokenizers.src.encode("Ein Mädchen übt.")


def test_without_a_test_split_none_is_written(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    report = prepare_corpus(config)
    assert sorted(report["splits"]) == ["train", "valid"]
    with pytest.raises(MtkitError) as caught:
        load_prepared(config.data_path, "test")
    assert str(caught.value) == (f"{config.data_path}: prepared split 'test' not found; run `mtkit prepare RECIPE` first")


def test_prepare_before_training_tokenizers_says_what_to_run(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice)
    with pytest.raises(MtkitError, match="mtkit tokenizer train"):
        prepare_corpus(config)


def test_prepare_refuses_a_training_split_that_cleaning_empties(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    config.data.max_len = 1
    with pytest.raises(MtkitError) as caught:
        prepare_corpus(config)
    message = str(caught.value)
    assert message.startswith("data.train: cleaning removed every pair (total 1000, empty 0, too_long 1000,")
    assert "\n" not in message


def test_errors_name_the_split_in_the_recipe(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    missing = tmp_path / "missing.en"
    config.data.valid[0].tgt = str(missing)
    with pytest.raises(MtkitError) as caught:
        prepare_corpus(config)
    assert str(caught.value) == f"{missing}: file not found; check data.valid.tgt in the recipe"


# Streaming, several corpora, interruption


def write_pairs(path: Path, pairs: list[tuple[str, str]]) -> dict[str, str]:
    (path.parent).mkdir(parents=True, exist_ok=True)
    path.with_suffix(".de").write_text("".join(f"{src}\n" for src, _ in pairs), encoding="utf-8")
    path.with_suffix(".en").write_text("".join(f"{tgt}\n" for _, tgt in pairs), encoding="utf-8")
    return {"src": str(path.with_suffix(".de")), "tgt": str(path.with_suffix(".en"))}


def test_chunks_stream_and_duplicates_are_found_across_chunks_and_corpora(tmp_path, multi30k_slice, monkeypatch):
    monkeypatch.setattr("mtkit.data.prepare.CHUNK_PAIRS", 7)  # many chunks; a repeat lands in a later chunk
    config = multi30k_recipe(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    lines = Path(config.data.train[0].src).read_text().splitlines(), Path(config.data.train[0].tgt).read_text().splitlines()
    first = list(zip(*lines, strict=True))[:40]
    news = write_pairs(tmp_path / "news" / "news", [first[3], ("Ein neuer Satz.", "A new sentence."), first[3], first[39]])
    multi30k = dataclasses.replace(config.data.train[0], name="multi30k", weight=0.5)
    config.data.train = [multi30k, TrainSource(**news, name="news", weight=2.0)]
    report = prepare_corpus(config)
    assert [corpus["name"] for corpus in report["corpora"]] == ["multi30k", "news"]
    assert [corpus["weight"] for corpus in report["corpora"]] == [0.5, 2.0]
    assert report["corpora"][1]["clean"] == {
        "total": 4,
        "empty": 0,
        "too_long": 0,
        "ratio": 0,
        "duplicate": 3,
        "copy": 0,
        "kept": 1,
    }
    assert report["clean"]["total"] == TRAIN_LINES + 4 and report["clean"]["kept"] == TRAIN_LINES + 1
    train = load_prepared(config.data_path, "train")
    assert train["corpus"] == [0] * TRAIN_LINES + [1]
    assert train[-1]["src"] == "Ein neuer Satz."
    assert train["src"][:TRAIN_LINES] == list(lines[0])  # in order, across all the chunks


def test_chunks_are_cut_by_the_memory_their_text_takes_as_well_as_by_pairs(monkeypatch):
    long, short = ("a" * 1000, "b" * 1000), ("c", "d")
    monkeypatch.setattr("mtkit.data.prepare.CHUNK_BYTES", 2 * (sys.getsizeof(long[0]) + sys.getsizeof(long[1])))
    monkeypatch.setattr("mtkit.data.prepare.CHUNK_PAIRS", 12)
    chunks = list(_chunks([long] * 5 + [short] * 30, "test"))
    assert [len(chunk) for chunk in chunks] == [2, 2, 1 + 11, 12, 7]  # two long pairs fill a chunk; short ones count
    assert [pair for chunk in chunks for pair in chunk] == [long] * 5 + [short] * 30


class RecordingFilter:
    """A filter rule that keeps every pair and records what it was given."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def drops(self, pairs: list[tuple[str, str]], languages: tuple[str, str]) -> list[str | None]:
        self.seen += pairs
        return [None] * len(pairs)


def test_a_huge_line_is_counted_too_long_and_no_filter_reads_it(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    append_lines(Path(config.data.train[0].src), ["x" * 3_000_000])  # one word: within max_len
    append_lines(Path(config.data.train[0].tgt), ["y" * 3_000_000])
    recorder = RecordingFilter()
    report = prepare_corpus(config, [recorder])
    assert report["clean"]["too_long"] == 1 and report["clean"]["total"] == TRAIN_LINES + 1
    assert len(recorder.seen) == report["clean"]["kept"] == TRAIN_LINES
    assert max(len(side) for pair in recorder.seen for side in pair) <= character_cap(config.data)
