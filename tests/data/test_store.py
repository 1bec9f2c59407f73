"""The prepared data directory: its atomic swap, what an interrupted prepare leaves, and older layouts."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from helpers import append_lines, multi30k_recipe

from mtkit.config import config_to_dict
from mtkit.data.prepare import prepare_corpus, train_tokenizers
from mtkit.data.store import FEATURES, corpus_column, load_prepared
from mtkit.errors import MtkitError

TRAIN_LINES = 1000
KILL_DURING = """
import os, signal, sys
from mtkit.data import store as prepared
from mtkit.config import load_config
from mtkit.data.prepare import prepare_corpus

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
import mtkit.data.prepare
mtkit.data.prepare.CHUNK_PAIRS = 100
prepare_corpus(load_config(sys.argv[1]))
"""


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


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["write", "swap"])
def test_killing_prepare_leaves_data_that_train_uses_as_before_or_refuses_in_one_line(tmp_path, multi30k_slice, stage):
    import subprocess
    import sys

    import yaml

    config = multi30k_recipe(tmp_path, multi30k_slice, with_test=False)
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
