"""`train.cuda_graphs`: the compiled step replayed as CUDA graphs, asked for only with a compiled step and bounded
batch shapes (a graph is recorded per shape), and only on CUDA (the CPU has no graphs to replay)."""

from __future__ import annotations

import pytest
import torch

from mtkit.config import TrainConfig, load_config
from mtkit.errors import MtkitError
from mtkit.training.levers import Levers

RECIPE = "recipes/multi30k/transformer.yaml"


@pytest.mark.parametrize("compile_mode", ["true", "layers", "auto"])
def test_graphs_are_on_with_cuda_a_compiled_step_and_bounded_shapes(compile_mode):
    config = TrainConfig(compile=compile_mode, shapes="16", cuda_graphs="true")
    cuda = Levers.of(config, torch.device("cuda"))
    assert cuda.graphs and cuda.compile
    assert "replayed as CUDA graphs" in cuda.describe()
    assert not Levers.of(config, torch.device("cpu")).graphs


def test_auto_is_off():
    assert not Levers.of(TrainConfig(compile="true", shapes="16"), torch.device("cuda")).graphs


@pytest.mark.parametrize("overrides", [["train.compile=false", "train.shapes=16"], ["train.compile=true", "train.shapes=0"]])
def test_graphs_without_a_compiled_step_or_bounded_shapes_are_refused_in_one_line(overrides):
    with pytest.raises(MtkitError, match="train.cuda_graphs.*give train.compile .* and train.shapes") as err:
        load_config(RECIPE, [*overrides, "train.cuda_graphs=true"])
    assert "\n" not in str(err.value)


def test_the_recipe_key_is_accepted_with_both():
    config = load_config(RECIPE, ["train.compile=layers", "train.shapes=16", "train.cuda_graphs=true"])
    assert config.train.cuda_graphs == "true"
