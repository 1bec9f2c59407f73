"""A prepare killed (in a child process) while writing or swapping the data leaves data that `train` uses as
before, or refuses in one line."""

from __future__ import annotations

import pytest
from helpers import multi30k_recipe

from mtkit.config import config_to_dict
from mtkit.data.prepare import prepare_corpus, train_tokenizers
from mtkit.data.store import load_prepared
from mtkit.errors import MtkitError

KILL_DURING = """
import os, signal, sys
from mtkit.data import store as prepared
from mtkit.config import load_config
from mtkit.data.prepare import prepare_corpus

stage = sys.argv[2]
if stage == "write":  # killed while the second chunk is written: nothing is swapped in
    original_write, calls = prepared.SplitWriter.write, []
    def write(self, *args, **options):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        original_write(self, *args, **options)
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
        assert len(load_prepared(config.data_path, "valid")) == 100
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
