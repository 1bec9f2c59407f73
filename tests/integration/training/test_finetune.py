"""Fine-tuning (`train.init_from`, `--init-from`): the parent's weights, architecture and tokenizers, a fresh start otherwise."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from helpers import cli_output, reverse_task_config, write_reverse_task
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.config import config_to_dict, load_config
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import load_tokenizers
from mtkit.models.checkpoint import checkpoint_tokenizers, load_model, read_checkpoint
from mtkit.training.trainer import train
from mtkit.training.validation import validate


def child_recipe(directory: Path, parent: Path, **train: object) -> Path:
    """A recipe for new reverse-task data (another seed) without `model` and `tokenizer` sections."""
    write_reverse_task(directory / "raw", train_pairs=400, valid_pairs=30, seed=7)
    recipe = config_to_dict(reverse_task_config(directory))
    del recipe["model"], recipe["tokenizer"]
    recipe["train"] = {**recipe["train"], "max_steps": 20, "validate_every": 10, "keep": 5, "init_from": str(parent), **train}
    path = directory / "child.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def _failure(*arguments: object) -> str:
    result = CliRunner().invoke(app, [str(a) for a in arguments])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtkit: error:"), result.output
    return lines[0]


def test_a_fine_tuning_recipe_takes_its_parents_model_tokenizer_and_normalisation(reverse_run, tmp_path):
    config = load_config(child_recipe(tmp_path, reverse_run.run_path))
    assert config.model == reverse_run.model
    assert config.tokenizer == reverse_run.tokenizer
    assert config.data.normalize == reverse_run.data.normalize
    dropout = load_config(child_recipe(tmp_path, reverse_run.run_path), ["model.dropout=0.2"])
    assert dropout.model.dropout == 0.2  # a training setting, free to change


@pytest.mark.parametrize(("key", "value"), [("model.d_model", 128), ("tokenizer.vocab_size", 90), ("data.normalize", "NFKC")])
def test_a_value_that_disagrees_with_the_parent_is_one_error_naming_the_key(reverse_run, tmp_path, key, value):
    recipe = child_recipe(tmp_path, reverse_run.run_path)
    line = _failure("prepare", recipe, "--set", f"{key}={value}")
    assert f"'{key}'" in line and "parent" in line
    assert not (tmp_path / "data").exists()  # refused before anything is written


def test_tokenizer_training_is_refused_and_a_missing_parent_is_named(reverse_run, tmp_path):
    recipe = child_recipe(tmp_path, reverse_run.run_path)
    assert "init_from" in _failure("tokenizer", "train", recipe)
    line = _failure("train", recipe, "--init-from", tmp_path / "nowhere")
    assert "nowhere" in line and "train.init_from" in line


def test_fine_tuning_starts_from_the_parent_validated_as_step_0_with_a_fresh_optimiser(reverse_run, tmp_path):
    recipe = child_recipe(tmp_path, reverse_run.run_path)
    assert "written" in cli_output("prepare", recipe)
    config = load_config(recipe)
    train(config)
    parent, _, tokenizers, parent_payload = load_model(reverse_run.run_path)
    assert checkpoint_tokenizers(read_checkpoint(config.run_path / "last.pt")).src.model_proto == tokenizers.src.model_proto
    valid = load_prepared(config.data_path, "valid")
    cpu = torch.device("cpu")
    expected = validate(parent.eval(), valid=valid, tokenizers=tokenizers, config=config, device=cpu, amp_dtype=None)
    records = [json.loads(line) for line in (config.run_path / "log.jsonl").read_text().splitlines()]
    first = next(r for r in records if "valid_bleu" in r)
    assert first["step"] == 0 and first["valid_bleu"] == pytest.approx(expected.bleu)
    start = read_checkpoint(config.run_path / "step_00000000.pt")
    for name, value in parent_payload["model"].items():
        torch.testing.assert_close(start["model"][name], value, rtol=0, atol=0, msg=name)
    last = read_checkpoint(config.run_path / "last.pt")
    assert last["progress"]["step"] == 20 and last["scheduler"]["last_epoch"] == 20  # counted afresh, not from the parent
    assert parent_payload["progress"]["step"] >= 250  # the parent had trained on


def test_freezing_keeps_those_parts_of_the_parent_and_says_what_is_trained(reverse_run, tmp_path, capsys):
    recipe = child_recipe(tmp_path, reverse_run.run_path, freeze="embeddings, encoder")
    cli_output("prepare", recipe)
    train(load_config(recipe))
    assert "parameters are trained" in capsys.readouterr().err
    parent = read_checkpoint(reverse_run.run_path)["model"]
    child = read_checkpoint(tmp_path / "run" / "last.pt")["model"]
    kept = [name for name in parent if name.startswith(("src_embed", "encoder_layers"))]
    assert kept and all(torch.equal(child[name], parent[name]) for name in kept)
    assert not all(torch.equal(child[name], parent[name]) for name in parent if name.startswith("decoder_layers"))


def test_extend_vocab_adds_the_new_datas_pieces_and_starts_their_rows_from_the_parents(reverse_run, tmp_path):
    recipe = child_recipe(tmp_path, reverse_run.run_path, max_steps=10, validate_every=10)
    rng = random.Random(3)  # the new data uses letters the parent never saw
    sources = [" ".join(rng.choice("abcmnopqrs") for _ in range(rng.randint(3, 7))) for _ in range(400)]
    for name in ("train", "valid"):
        (tmp_path / "raw" / f"{name}.src").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
        (tmp_path / "raw" / f"{name}.tgt").write_text(
            "".join(" ".join(reversed(s.split())) + "\n" for s in sources), encoding="utf-8"
        )
    _, _, parent_tokenizers, parent_payload = load_model(reverse_run.run_path)
    assert parent_tokenizers.src.encode("m n").count(1) == 2  # unknown to the parent
    said = cli_output("prepare", recipe, "--extend-vocab", 40)
    assert "new pieces" in said
    config = load_config(recipe)
    child = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    old_size = parent_tokenizers.src.vocab_size
    assert child.src.vocab_size > old_size and child.src.all_pieces()[:old_size] == parent_tokenizers.src.all_pieces()
    assert child.src.encode("a b c") == parent_tokenizers.src.encode("a b c")  # the parent's pieces keep their ids
    assert 1 not in child.src.encode("m n o p q r s")  # the new letters are pieces now
    train(config)
    start = read_checkpoint(config.run_path / "step_00000000.pt")["model"]["src_embed.embedding.weight"]
    parent = parent_payload["model"]["src_embed.embedding.weight"]
    assert torch.equal(start[:old_size], parent)
    piece = child.src.all_pieces()[old_size]
    expected = parent[parent_tokenizers.src.encode(piece.replace("\u2581", " ").strip()) or [1]].mean(dim=0)
    torch.testing.assert_close(start[old_size], expected, rtol=0, atol=0)
    assert "--extend-vocab" in _failure("prepare", child_recipe(tmp_path / "plain", reverse_run.run_path), "--extend-vocab", 3)
