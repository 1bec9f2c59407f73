"""Tests for mtkit.prepare: tokenizer training and the Arrow splits written by `prepare_corpus`."""

from __future__ import annotations

import dataclasses
import json
import unicodedata
from collections.abc import Callable
from pathlib import Path

import datasets
import pytest

from mtkit.config import Config, TrainSource, config_from_dict, config_to_dict
from mtkit.errors import MtkitError
from mtkit.prepare import load_prepared, prepare_corpus, train_tokenizers
from mtkit.prepared import FEATURES, corpus_column
from mtkit.tokenizer import BOS_ID, EOS_ID, UNK_ID

TRAIN_LINES = 1000


def make_config(
    tmp_path: Path, multi30k_slice: Callable[[str, str, int], Path], joint: bool = True, with_test: bool = True
) -> Config:
    """A recipe over Multi30k slices: 1000 training pairs, 100 validation and 100 test pairs."""

    def files(split: str, count: int) -> dict[str, str]:
        return {"src": str(multi30k_slice(split, "de", count)), "tgt": str(multi30k_slice(split, "en", count))}

    data = {"train": files("train", TRAIN_LINES), "valid": files("val", 100)}
    if with_test:
        data["test"] = files("test_2016_flickr", 100)
    return config_from_dict(
        {
            "name": "tiny",
            "src_lang": "de",
            "tgt_lang": "en",
            "data_dir": str(tmp_path / "data"),
            "data": data,
            "tokenizer": {"vocab_size": 300, "joint": joint},
        }
    )


def append_lines(path: Path, lines: list[str]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(f"{line}\n" for line in lines)


# Tokenizers


def test_joint_tokenizer_is_one_model_for_both_languages(tmp_path, multi30k_slice):
    config = make_config(tmp_path, multi30k_slice, joint=True)
    tokenizers = train_tokenizers(config)
    assert tokenizers.joint
    assert sorted(path.name for path in config.data_path.iterdir()) == ["spm.model"]
    assert tokenizers.src.vocab_size <= 300
    for sentence in ("Zwei Männer stehen im Freien.", "Two men are standing outside."):
        ids = tokenizers.src.encode(sentence)
        assert UNK_ID not in ids
        assert tokenizers.tgt.decode(ids) == sentence


def test_separate_tokenizers_are_trained_per_language(tmp_path, multi30k_slice):
    config = make_config(tmp_path, multi30k_slice, joint=False)
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
    first = train_tokenizers(make_config(tmp_path / "a", multi30k_slice))
    second = train_tokenizers(make_config(tmp_path / "b", multi30k_slice))
    assert first.src.model_proto == second.src.model_proto


# Prepared splits


def test_prepare_writes_arrow_splits_whose_ids_decode_to_the_text(tmp_path, multi30k_slice):
    config = make_config(tmp_path, multi30k_slice)
    tokenizers = train_tokenizers(config)
    report = prepare_corpus(config)
    for name, expected_pairs in (("train", TRAIN_LINES), ("valid", 100), ("test", 100)):
        dataset = load_prepared(config.data_path, name)
        assert isinstance(dataset, datasets.Dataset)
        assert dataset.features["src_ids"].feature.dtype == "int32"
        assert dataset.features["tgt_ids"].feature.dtype == "int32"
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
    config = make_config(tmp_path, multi30k_slice)
    first_pair = (
        Path(config.data.train[0].src).read_text().splitlines()[0],
        Path(config.data.train[0].tgt).read_text().splitlines()[0],
    )
    append_lines(Path(config.data.train[0].src), [first_pair[0], "", "Hallo"])
    append_lines(Path(config.data.train[0].tgt), [first_pair[1], "Hello", "Hallo"])
    append_lines(Path(config.data.valid.src), [""])  # an empty valid pair is kept: only train is cleaned
    append_lines(Path(config.data.valid.tgt), ["An empty source."])
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
    config = make_config(tmp_path, multi30k_slice, with_test=False)
    decomposed = unicodedata.normalize("NFD", "Ein Mädchen übt.")
    append_lines(Path(config.data.valid.src), [decomposed])
    append_lines(Path(config.data.valid.tgt), ["A girl practises."])
    tokenizers = train_tokenizers(config)
    prepare_corpus(config)
    last = load_prepared(config.data_path, "valid")[-1]
    assert last["src"] == "Ein Mädchen übt."
    assert last["src_ids"] == tokenizers.src.encode("Ein Mädchen übt.")


def test_without_a_test_split_none_is_written(tmp_path, multi30k_slice):
    config = make_config(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    report = prepare_corpus(config)
    assert sorted(report["splits"]) == ["train", "valid"]
    with pytest.raises(MtkitError) as caught:
        load_prepared(config.data_path, "test")
    assert str(caught.value) == (f"{config.data_path}: prepared split 'test' not found; run `mtkit prepare RECIPE` first")


def test_prepare_before_training_tokenizers_says_what_to_run(tmp_path, multi30k_slice):
    config = make_config(tmp_path, multi30k_slice)
    with pytest.raises(MtkitError, match="mtkit tokenizer train"):
        prepare_corpus(config)


def test_prepare_refuses_a_training_split_that_cleaning_empties(tmp_path, multi30k_slice):
    config = make_config(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    config.data.max_len = 1
    with pytest.raises(MtkitError) as caught:
        prepare_corpus(config)
    message = str(caught.value)
    assert message.startswith("data.train: cleaning removed every pair (total 1000, empty 0, too_long 1000,")
    assert "\n" not in message


def test_errors_name_the_split_in_the_recipe(tmp_path, multi30k_slice):
    config = make_config(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    missing = tmp_path / "missing.en"
    config.data.valid.tgt = str(missing)
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
    monkeypatch.setattr("mtkit.prepare.CHUNK_PAIRS", 7)  # many chunks; a repeat lands in a later chunk
    config = make_config(tmp_path, multi30k_slice, with_test=False)
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


def test_a_failed_prepare_leaves_the_previous_data_as_it_was(tmp_path, multi30k_slice):
    config = make_config(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    before = prepare_corpus(config)
    rows = load_prepared(config.data_path, "train")[:]
    append_lines(Path(config.data.train[0].src), ["Ein Satz zu viel."])  # found only at the end of the stream
    with pytest.raises(MtkitError, match="has 1001 lines but"):
        prepare_corpus(config)
    assert load_prepared(config.data_path, "train")[:] == rows
    assert json.loads((config.data_path / "prepare_report.json").read_text()) == before
    assert sorted(path.name for path in config.data_path.iterdir()) == ["prepare_report.json", "spm.model", "train", "valid"]


KILL_DURING = """
import os, signal, sys
from mtkit import prepared
from mtkit.config import load_config
from mtkit.prepare import prepare_corpus

stage = sys.argv[2]
if stage == "write":  # killed while the second chunk is written: nothing is swapped in
    original_write, calls = prepared.SplitWriter.write, []
    def write(self, *args):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        original_write(self, *args)
    prepared.SplitWriter.write = write
else:  # killed in the middle of the swap: the new train split is in place, the old valid split not yet replaced
    original_rename = prepared.Path.rename
    def rename(self, target):
        result = original_rename(self, target)
        if self.name == "train" and self.parent.name == prepared.PARTIAL_DIR:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    prepared.Path.rename = rename
import mtkit.prepare
mtkit.prepare.CHUNK_PAIRS = 100
prepare_corpus(load_config(sys.argv[1]))
"""


@pytest.mark.parametrize("stage", ["write", "swap"])
def test_killing_prepare_leaves_data_that_train_uses_as_before_or_refuses_in_one_line(tmp_path, multi30k_slice, stage):
    import subprocess
    import sys

    import yaml

    config = make_config(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    prepare_corpus(config)
    rows = load_prepared(config.data_path, "train")[:]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(config_to_dict(config)), encoding="utf-8")
    killed = subprocess.run([sys.executable, "-c", KILL_DURING, str(recipe), stage], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    if stage == "write":
        assert load_prepared(config.data_path, "train")[:] == rows
        assert load_prepared(config.data_path, "valid").num_rows == 100
    else:
        with pytest.raises(MtkitError) as caught:
            load_prepared(config.data_path, "train")
        assert str(caught.value) == (
            f"{config.data_path}: the prepared data is incomplete (a `mtkit prepare` was interrupted while replacing it); "
            "run `mtkit prepare RECIPE` again"
        )
    prepare_corpus(config)  # the next prepare clears what the killed one left
    assert load_prepared(config.data_path, "train")[:] == rows
    assert not (config.data_path / ".prepare-partial").exists()


def test_data_prepared_by_an_older_version_still_loads(tmp_path):
    old = datasets.Dataset.from_dict({"src": ["a"], "tgt": ["b"], "src_ids": [[5]], "tgt_ids": [[6]]}, features=FEATURES)
    old.save_to_disk(str(tmp_path / "train"))
    loaded = load_prepared(tmp_path, "train")
    assert loaded[0] == {"src": "a", "tgt": "b", "src_ids": [5], "tgt_ids": [6]}
    assert corpus_column(tmp_path, loaded, ["train.de"]).tolist() == [0]
    with pytest.raises(MtkitError, match="the recipe trains on corpora a, b but the data was prepared from train"):
        corpus_column(tmp_path, loaded, ["a", "b"])
