"""LoRA runs (train.lora) from a tiny training: checkpoints of adapters naming a hashed parent, an optimiser of
adapters alone, an exact resume, `mtkit merge` and the exports translating as the LoRA run does token for token, and
a changed or missing parent, or a bad key, refused in one line."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers import assert_one_line_error, cli_output, invoke, prepared_reverse_task, succeeded

from mtkit.config import Config, config_to_dict
from mtkit.decoding.ct2_engine import load_export
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.models.checkpoint import LORA_PARENT, read_checkpoint, save_checkpoint
from mtkit.models.lora import ADAPTER_NAMES, weights_digest
from mtkit.training.trainer import Trainer, train

LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.1, "targets": ["qkv", "query", "key_value", "out", "inner", "embedding"]}
LINES = ["a b c d", "e f g", "h i j k l", "b d f h j l"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Config]:
    """A parent trained four updates, and a LoRA child of it trained four more: (parent, child)."""
    root = tmp_path_factory.mktemp("lora")
    parent = prepared_reverse_task(root / "parent", max_steps=4, validate_every=4)
    train(parent)
    child = _child(root / "child", parent, max_steps=4, validate_every=2, log_every=1)
    train(child)
    return parent, child


def _child(directory: Path, parent: Config, **train: object) -> Config:
    return prepared_reverse_task(directory, init_from=str(parent.run_path), lora=LORA, **train)


def test_a_lora_run_saves_its_adapters_its_parent_s_digest_and_an_optimiser_of_adapters(runs):
    parent, child = runs
    last = read_checkpoint(child.run_path / "last.pt")
    assert last["model"] and all(name.rpartition(".")[2] in ADAPTER_NAMES for name in last["model"])
    parent_weights = read_checkpoint(parent.run_path / "best.pt")["model"]
    assert last[LORA_PARENT] == {
        "path": str((parent.run_path / "best.pt").resolve()),
        "weights_sha256": weights_digest(parent_weights),
    }
    optimised = sum(len(group["params"]) for group in last["optimizer"]["param_groups"])
    assert optimised == len(last["model"]) == len(last["optimizer"]["state"])
    assert read_checkpoint(child.run_path / "best.pt")[LORA_PARENT] == last[LORA_PARENT]


def _translations(model: Path, *extra: object) -> list[str]:
    return succeeded(invoke("translate", "-m", model, *extra, input="\n".join(LINES) + "\n")).stdout.splitlines()


def test_the_merged_run_and_the_exports_translate_as_the_lora_run_token_for_token(runs, tmp_path):
    parent, child = runs
    run = tmp_path / "child"
    shutil.copytree(child.run_path, run)
    best = read_checkpoint(run / "best.pt")
    generator = torch.Generator().manual_seed(0)
    for name, tensor in best["model"].items():  # adapters far from zero: the LoRA run translates unlike its parent
        best["model"][name] = torch.randn(tensor.shape, generator=generator) * 0.5
    save_checkpoint(best, run / "best.pt")
    adapted = _translations(run)
    assert adapted != _translations(parent.run_path)

    said = cli_output("merge", run, "-o", tmp_path / "merged")
    assert f"into {tmp_path / 'merged' / 'best.pt'}" in said
    merged = read_checkpoint(tmp_path / "merged")
    assert LORA_PARENT not in merged and merged["config"]["train"]["lora"] is None
    assert _translations(tmp_path / "merged") == adapted
    cli_output("export", "-m", run, "-o", tmp_path / "ct2", "--format", "ctranslate2")
    assert Translator.over(load_export(tmp_path / "ct2", threads=1)).translate(LINES) == adapted  # as many threads as found
    for source, folder in ((run, "hf-lora"), (tmp_path / "merged", "hf-merged")):
        cli_output("export", "-m", source, "-o", tmp_path / folder, "--format", "transformers")
    written = [(tmp_path / folder / "model.safetensors").read_bytes() for folder in ("hf-lora", "hf-merged")]
    assert written[0] == written[1]  # the export of the LoRA run holds the merged weights


def test_a_resumed_lora_run_ends_with_the_adapters_of_one_run_straight_through(runs, tmp_path, monkeypatch):
    parent, _ = runs
    settings = {"max_steps": 8, "validate_every": 4, "log_every": 1, "batch_tokens": 300}
    straight = _child(tmp_path / "straight", parent, **settings)
    train(straight)
    interrupted = _child(tmp_path / "interrupted", parent, **settings)
    limit = Trainer._limit_reached  # stopped at update 4 as by Ctrl-C: the recipe (and its schedule) unchanged
    monkeypatch.setattr(Trainer, "_limit_reached", lambda trainer: trainer.progress.step >= 4 or limit(trainer))
    train(interrupted)
    monkeypatch.undo()
    train(interrupted, resume=True)

    ends = [read_checkpoint(config.run_path / "last.pt") for config in (straight, interrupted)]
    assert ends[0]["step"] == ends[1]["step"] == 8
    assert ends[0]["model"].keys() == ends[1]["model"].keys()
    for name, value in ends[0]["model"].items():
        torch.testing.assert_close(ends[1]["model"][name], value, rtol=0, atol=0, msg=name)

    def losses(config: Config) -> list[tuple[int, float]]:
        records = map(json.loads, (config.run_path / "log.jsonl").read_text().splitlines())
        return [(record["step"], record["train_loss"]) for record in records if "train_loss" in record]

    assert losses(interrupted) == losses(straight)


def _with_parent(child: Config, tmp_path: Path, *, change: bool) -> Path:
    """A copy of the LoRA run whose record names a copy of its parent's checkpoint, one weight changed or not."""
    run = tmp_path / "child"
    shutil.copytree(child.run_path, run)
    parent_file = tmp_path / "parent" / "best.pt"
    parent_file.parent.mkdir()
    for name in ("best.pt", "last.pt"):
        payload = read_checkpoint(run / name)
        shutil.copyfile(payload[LORA_PARENT]["path"], parent_file)
        payload[LORA_PARENT] = payload[LORA_PARENT] | {"path": str(parent_file)}
        save_checkpoint(payload, run / name)
    if change:
        parent = read_checkpoint(parent_file)
        parent["model"]["output.weight"][5, 5] += 1e-3
        save_checkpoint(parent, parent_file)
    return run


def test_a_changed_parent_is_refused_in_one_line_by_every_command_and_by_resume(runs, tmp_path):
    _, child = runs
    run = _with_parent(child, tmp_path, change=True)
    for command in (["translate", "-m", run], ["merge", run, "-o", tmp_path / "merged"]):
        result = invoke(*command, input="a b c\n")
        assert_one_line_error(result, f"{run / 'best.pt'}: the weights of its LoRA parent", "changed since", "put the parent")
    assert not (tmp_path / "merged").exists()
    resumed = dataclasses.replace(child, run_dir=str(run), train=dataclasses.replace(child.train, max_steps=6))
    resumed.train.init_from = str(tmp_path / "parent" / "best.pt")
    with pytest.raises(MtkitError, match=r"last.pt: the weights of its LoRA parent .* changed since"):
        train(resumed, resume=True)


def test_a_moved_parent_is_found_by_its_init_from_from_here_and_a_missing_one_is_one_line(runs, tmp_path, monkeypatch):
    parent, child = runs
    run = _with_parent(child, tmp_path, change=False)
    expected = _translations(child.run_path)
    assert _translations(run) == expected
    (tmp_path / "parent" / "best.pt").unlink()  # the recorded path is gone: train.init_from names the parent
    best = read_checkpoint(run / "best.pt")
    best["config"]["train"]["init_from"] = "moved/parent"  # a path from the project's folder, as a recipe gives it
    save_checkpoint(best, run / "best.pt")
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke("translate", "-m", run, input="a b c\n"), "whose parent", "is gone", "moved/parent")
    shutil.copytree(parent.run_path, tmp_path / "moved" / "parent")  # the project moved, its runs with it
    assert _translations(run) == expected


def test_a_bad_lora_key_and_a_plain_run_to_merge_are_one_line(runs, tmp_path):
    parent, child = runs
    recipe = tmp_path / "child.yaml"
    recipe.write_text(yaml.safe_dump(config_to_dict(child)), encoding="utf-8")
    result = invoke("train", recipe, "--set", "train.lora.targets=[qkv, attention]")
    assert_one_line_error(result, "'train.lora.targets'", "'attention' is not a layer LoRA adapts", "qkv, query")
    assert_one_line_error(invoke("merge", parent.run_path, "-o", tmp_path / "out"), "not a LoRA run")
    steps = tmp_path / "steps"
    steps.mkdir()
    shutil.copyfile(child.run_path / "last.pt", steps / "step_4.pt")
    assert_one_line_error(invoke("average", "-m", steps, "--last", "1"), "a LoRA run's checkpoints hold adapters")
    again = ["--set", f"train.init_from={child.run_path}", "--set", "train.lora=null", "--set", f"run_dir={tmp_path / 'run'}"]
    result = invoke("train", recipe, *again)
    assert result.exit_code == 2 and "a LoRA run holds adapters alone; merge it" in result.stderr
