"""train.shard=fsdp over two CPU processes (gloo), fine-tuning a parent: the losses of DDP over the same two, an
exact resume, and a best.pt that every command reads as a plain run's. One set of trainings (each torchrun job costs seconds of
starting) serves every test here."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from helpers import invoke, prepared_reverse_task, succeeded, torchrun_mtkit

from mtkit.config import Config, config_to_dict
from mtkit.models.checkpoint import read_checkpoint
from mtkit.training.trainer import train

REPO = Path(__file__).resolve().parents[3]
UPDATES = 20
# A short warmup, so that 20 updates move the weights enough to be compared
SETTINGS = {"max_steps": UPDATES, "validate_every": 10, "log_every": 1, "batch_tokens": 300, "warmup_steps": 5}


def train_under_torchrun(config: Config, name: str, *arguments: str, **train: object) -> Path:
    """Train `config` with `train` changed, in run directory <data's parent>/<name>, as a 2-process torchrun job."""
    changed = dataclasses.replace(config, run_dir=str(Path(config.data_path).parent / name))
    changed.train = dataclasses.replace(config.train, **train)
    recipe = Path(config.data_path).parent / f"{name}.yaml"
    recipe.write_text(yaml.safe_dump(config_to_dict(changed)))
    job = subprocess.run(torchrun_mtkit(2, "train", recipe, *arguments), cwd=REPO, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr[-3000:]
    return changed.run_path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fine-tuning a parent of 5 updates (its weights loaded into the shards): DDP and FSDP straight through 20
    updates, and FSDP stopped after 10 then resumed, with the folder of an interrupted shard write planted between."""
    root = tmp_path_factory.mktemp("sharding")
    parent = prepared_reverse_task(root / "parent", max_steps=5, validate_every=5)
    train(parent)  # here: a process of its own would only add its start
    config = prepared_reverse_task(root / "child", init_from=str(parent.run_path), **SETTINGS)
    ddp = train_under_torchrun(config, "ddp", shard="none")
    fsdp = train_under_torchrun(config, "fsdp", shard="fsdp")
    resumed = train_under_torchrun(config, "resumed", shard="fsdp", max_steps=10)
    (resumed / "sharded" / "step_00000015").mkdir()  # a write killed before last.pt named it
    train_under_torchrun(config, "resumed", "--resume", "--set", f"train.max_steps={UPDATES}", shard="fsdp")
    return {"ddp": ddp, "fsdp": fsdp, "resumed": resumed, "valid": Path(config.data.valid[0].src)}


def losses(run: Path) -> list[float]:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return [record["train_loss"] for record in records if "train_loss" in record]


def test_fsdp_gives_the_loss_per_update_of_ddp_over_the_same_processes(runs):
    ddp, fsdp = losses(runs["ddp"]), losses(runs["fsdp"])
    assert len(ddp) == len(fsdp) == UPDATES
    assert fsdp == pytest.approx(ddp, rel=1e-4)
    assert ddp[-1] < ddp[0] - 1  # it learned something


def test_a_resumed_fsdp_run_equals_one_straight_through(runs):
    straight, resumed = (read_checkpoint(runs[name] / "last.pt") for name in ("fsdp", "resumed"))
    assert straight["step"] == resumed["step"] == UPDATES
    for name, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][name], value, rtol=0, atol=0, msg=name)
    assert losses(runs["resumed"]) == losses(runs["fsdp"])
    # last.pt names its shards, which are the only ones left; it holds no whole optimiser
    assert resumed["sharded"] == {"folder": f"sharded/step_{UPDATES:08d}", "processes": 2, "optimizer": True}
    assert "optimizer" not in resumed
    assert [path.name for path in (runs["resumed"] / "sharded").iterdir()] == [f"step_{UPDATES:08d}"]


def test_last_pt_holds_the_weights_its_shards_hold(runs, tmp_path):
    """The whole weights rank 0 gathered are the shards' own, read back without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    last = read_checkpoint(runs["fsdp"] / "last.pt")
    dcp_to_torch_save(runs["fsdp"] / last["sharded"]["folder"], tmp_path / "shards.pt")
    shards = torch.load(tmp_path / "shards.pt", weights_only=True)
    assert shards["model"].keys() == last["model"].keys()
    for name, value in last["model"].items():
        assert torch.equal(shards["model"][name], value), name


def test_its_best_pt_translates_like_a_plain_runs(runs, tmp_path):
    fsdp, ddp = (read_checkpoint(runs[name] / "best.pt") for name in ("fsdp", "ddp"))
    assert fsdp["step"] == ddp["step"]
    assert fsdp.keys() == ddp.keys() and fsdp["model"].keys() == ddp["model"].keys()
    assert all(fsdp["model"][name].shape == value.shape for name, value in ddp["model"].items())
    for name in ("fsdp", "ddp"):
        succeeded(invoke("translate", "-m", runs[name], "-i", runs["valid"], "-o", tmp_path / f"{name}.txt"))
    translated = (tmp_path / "fsdp.txt").read_text(encoding="utf-8")
    assert translated == (tmp_path / "ddp.txt").read_text(encoding="utf-8")
    assert len(translated.splitlines()) == len(runs["valid"].read_text(encoding="utf-8").splitlines())
