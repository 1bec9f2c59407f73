"""The prepared data directory: its atomic swap and older layouts (a prepare killed mid-way: tests/system/data/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import append_lines, multi30k_recipe

from mtkit.data.prepare import prepare_corpus, train_tokenizers
from mtkit.data.store import SCHEMA, corpus_column, load_prepared
from mtkit.errors import MtkitError

TRAIN_LINES = 1000


def test_a_failed_prepare_leaves_the_previous_data_as_it_was(tmp_path, multi30k_slice):
    config = multi30k_recipe(tmp_path, multi30k_slice, with_test=False)
    train_tokenizers(config)
    before = prepare_corpus(config)
    rows = load_prepared(config.data_path, "train")[:]
    append_lines(Path(config.data.train[0].src), ["Ein Satz zu viel."])  # found only at the end of the stream
    with pytest.raises(MtkitError, match="has 1001 lines but"):
        prepare_corpus(config)
    assert load_prepared(config.data_path, "train")[:] == rows
    assert json.loads((config.data_path / "prepare_report.json").read_text()) == before
    assert sorted(path.name for path in config.data_path.iterdir()) == ["prepare_report.json", "spm.model", "train", "valid"]


def test_data_prepared_by_an_older_version_still_loads(tmp_path):
    import datasets  # a second to import: not at collection

    features = datasets.Features.from_arrow_schema(SCHEMA)
    old = datasets.Dataset.from_dict({"src": ["a"], "tgt": ["b"], "src_ids": [[5]], "tgt_ids": [[6]]}, features=features)
    old.save_to_disk(str(tmp_path / "train"))
    loaded = load_prepared(tmp_path, "train")
    assert loaded[0] == {"src": "a", "tgt": "b", "src_ids": [5], "tgt_ids": [6]}
    assert corpus_column(tmp_path, loaded, names=["train.de"]).tolist() == [0]
    with pytest.raises(MtkitError, match="the recipe trains on corpora a, b but the data was prepared from train"):
        corpus_column(tmp_path, loaded, names=["a", "b"])
