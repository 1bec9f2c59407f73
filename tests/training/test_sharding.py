"""train.shard=fsdp's refusals, each one line before anything is written, and how a resume is checked; the
training itself runs under torchrun in tests/system/training/test_sharding.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtkit.config import config_from_dict
from mtkit.distributed import Distributed
from mtkit.errors import MtkitError
from mtkit.models.transformer import Transformer
from mtkit.training import sharding
from mtkit.training.finetune import Lineage
from mtkit.training.levers import Levers
from mtkit.training.sharding import ShardedModel, WholeModel, check_sharding

TWO_PROCESSES = Distributed(rank=0, world_size=2)


@pytest.mark.parametrize(
    ("key", "value", "fix"),
    [
        ("ema", 0.999, "set train.ema=0"),
        ("bf16_weights", "true", "set train.bf16_weights=auto"),
        ("precision", "fp16", "set train.precision=bf16"),
        ("compile", "layers", "set train.compile=auto"),
        ("snapshots", "15m", "remove train.snapshots"),
        ("lora", {"rank": 8}, "remove train.lora"),
    ],
)
def test_what_fsdp_cannot_take_is_refused_when_the_recipe_is_read(key, value, fix):
    parent = {"init_from": "runs/parent"} if key == "lora" else {}  # what LoRA adapts
    config_from_dict({"train": {key: value, **parent}})  # fine unsharded
    with pytest.raises(MtkitError) as refused:
        config_from_dict({"train": {"shard": "fsdp", key: value, **parent}})
    message = str(refused.value)
    assert message.startswith("config: 'train.shard' is 'fsdp'; FSDP cannot take train.")
    assert fix in message and message.endswith("or set train.shard=none") and "\n" not in message


@pytest.mark.parametrize(
    ("recipe", "distributed", "said"),
    [
        ({}, Distributed(), "start it with torchrun --nproc_per_node N"),
        ({"model": {"arch": "rnn"}}, TWO_PROCESSES, "a model.arch=rnn model has no repeated layers"),
        ({"data": {"lang_tag": "code"}}, TWO_PROCESSES, "cannot train a model with language codes"),
    ],
)
def test_what_needs_the_job_or_the_whole_recipe_is_refused_before_training(recipe, distributed, said):
    config = config_from_dict({**recipe, "train": {"shard": "fsdp"}})
    with pytest.raises(MtkitError, match=said) as refused:
        check_sharding(config, distributed)
    assert "\n" not in str(refused.value) and str(refused.value).endswith("set train.shard=none")
    check_sharding(config_from_dict(recipe), distributed)  # unsharded: nothing to refuse


def test_a_torch_whose_fully_shard_cannot_leave_the_vocabulary_apart_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(sharding, "_fsdp_ignores_params", lambda: False)
    with pytest.raises(MtkitError, match=r"needs fully_shard's ignored_params \(torch .* lacks it\): install a newer") as refused:
        check_sharding(config_from_dict({"train": {"shard": "fsdp"}}), TWO_PROCESSES)
    assert "\n" not in str(refused.value)


def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(12, 12, layers=1, d_model=8, heads=2, ffn_dim=16)


def lineage(model: Transformer, tmp_path: Path) -> Lineage:
    config = config_from_dict({"run_dir": str(tmp_path)})
    return Lineage(model, config, tokenizers=None, device=torch.device("cpu"))  # no parent: no tokenizer read


def sharded(model: Transformer, tmp_path: Path, processes: int) -> ShardedModel:
    """A ShardedModel over a plain model: what it checks before any collective needs no process group."""
    optimizer = torch.optim.Adam(model.parameters())
    return ShardedModel(lineage(model, tmp_path), optimizer, distributed=Distributed(world_size=processes))


def test_a_sharded_run_resumes_on_as_many_processes_and_sharded_only(tmp_path):
    model, last = tiny_model(), tmp_path / "last.pt"
    payload = {"model": model.state_dict(), "sharded": {"folder": "sharded/step_00000010", "processes": 2, "optimizer": True}}
    with pytest.raises(MtkitError, match=rf"^{last}: written by 2 processes .* torchrun --nproc_per_node 2 "):
        sharded(model, tmp_path, 3).restore(payload, last=last)
    whole = WholeModel(lineage(model, tmp_path), torch.optim.Adam(model.parameters()))
    with pytest.raises(MtkitError, match="resume it with train.shard=fsdp under torchrun --nproc_per_node 2$"):
        whole.restore(payload, last=last)
    unsharded = {"model": model.state_dict(), "optimizer": whole.optimizer.state_dict()}
    with pytest.raises(MtkitError, match="written without sharding; resume it with train.shard=none"):
        sharded(model, tmp_path, 2).restore(unsharded, last=last)


def test_a_parents_weights_that_do_not_fit_are_one_line_and_fitting_ones_are_taken(tmp_path):
    model = tiny_model()
    holder = sharded(model, tmp_path, 2)
    weights = {name: torch.full_like(value, 0.5) for name, value in model.state_dict().items()}
    with pytest.raises(MtkitError, match=r"^parent: its weights do not fit the recipe's model \(first at output.bias\)$"):
        holder.load_full_weights({**weights, "output.bias": torch.zeros(12)}, source="parent")
    holder.load_full_weights(weights, source="parent")
    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())


def test_a_sharded_run_does_not_compile_its_step_by_default_on_cuda():
    cuda = torch.device("cuda")
    assert Levers.of(config_from_dict({}).train, cuda).compile
    assert not Levers.of(config_from_dict({"train": {"shard": "fsdp"}}).train, cuda).compile
