"""The `mtkit` command line through Typer's CliRunner, without a trained model: the commands listed, each a
thin call into the library, and bad input one clear line on stderr (the commands run end to end against a
tiny trained run in tests/integration/test_cli.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import assert_one_line_error, invoke, stdout_lines, succeeded

from mtkit.config import Config

REPO = Path(__file__).resolve().parents[1]


def test_help_lists_every_command():
    result = succeeded(invoke("--help"))
    for command in ("tokenizer", "prepare", "train", "translate", "evaluate"):
        assert command in result.stdout
    assert "train" in succeeded(invoke("tokenizer", "--help")).stdout


def test_prepare_and_tokenizer_train_are_each_one_library_call(tmp_path, monkeypatch):
    """Each command loads the recipe, calls its one function in `mtkit.training.run_data` and prints what it says."""
    import mtkit.training.run_data as run_data

    calls = []

    def one_call(name: str) -> Callable[..., SimpleNamespace]:
        def call(config: Config, *args: object, **options: object) -> SimpleNamespace:
            calls.append((name, config.name, args, options))
            return SimpleNamespace(lines=lambda: [f"{name}: done", "and said so"])

        return call

    monkeypatch.setattr(run_data, "prepare_run_data", one_call("prepare"))
    monkeypatch.setattr(run_data, "train_run_tokenizers", one_call("tokenizer"))
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("name: tiny\n", encoding="utf-8")
    prepared = succeeded(invoke("prepare", recipe, "--extend-vocab", 40, "--device", "cpu"))
    assert stdout_lines(prepared) == ["prepare: done", "and said so"]
    assert stdout_lines(succeeded(invoke("tokenizer", "train", recipe))) == ["tokenizer: done", "and said so"]
    assert calls == [
        ("prepare", "tiny", (), {"extend_vocab": 40, "device": "cpu", "fast_paths": True}),
        ("tokenizer", "tiny", (str(recipe),), {}),
    ]
    assert not (tmp_path / "data").exists()  # nothing but the one call did any work


def test_missing_recipe(tmp_path):
    missing = tmp_path / "nope.yaml"
    for command in (("prepare",), ("train",), ("tokenizer", "train")):
        assert_one_line_error(invoke(*command, missing), str(missing), "recipe not found")


@pytest.mark.parametrize(
    ("recipe", "override"),
    [
        ("transformer.yaml", "model.layers=-3"),
        ("transformer.yaml", "train.lr=-1"),
        ("transformer.yaml", "tokenizer.vocab_size=0"),
        ("transformer.yaml", "model.heads=7"),
        ("transformer.yaml", "train.batch_tokens=0"),
        ("transformer.yaml", "train.warmup_steps=-1"),
        ("transformer.yaml", "train.max_time=soon"),
        ("transformer.yaml", "decode.beam=0"),
        ("rnn.yaml", "model.hidden_size=-1"),
        ("rnn.yaml", "model.heads=4"),
    ],
)
def test_train_refuses_a_bad_recipe_value_before_creating_anything(tmp_path, recipe, override):
    data, run = tmp_path / "data", tmp_path / "run"
    path = REPO / "recipes" / "multi30k" / recipe
    result = invoke("train", path, "--set", override, "--set", f"data_dir={data}", "--set", f"run_dir={run}")
    assert_one_line_error(result, f"'{override.partition('=')[0]}'")
    assert not data.exists() and not run.exists()


def test_translate_missing_run_directory(tmp_path):
    missing = tmp_path / "no-such-run"
    assert_one_line_error(invoke("translate", "-m", missing, input="Ein Hund.\n"), str(missing))


def test_translate_run_directory_without_checkpoints(tmp_path):
    assert_one_line_error(invoke("translate", "-m", tmp_path, input="Ein Hund.\n"), str(tmp_path), "best.pt")


def test_translate_file_that_is_not_a_checkpoint(tmp_path):
    fake = tmp_path / "model.pt"
    fake.write_text("not a checkpoint", encoding="utf-8")
    assert_one_line_error(invoke("translate", "-m", fake, input="Ein Hund.\n"), str(fake))


@pytest.mark.parametrize("temperature", ["1e-300", "0.009", "1e308"])
def test_a_temperature_out_of_range_is_one_line_before_the_model_is_read(tmp_path, temperature):
    result = invoke("translate", "-m", tmp_path, "--sampling", "full", "--temperature", temperature, input="Ein Hund.\n")
    assert_one_line_error(result, f"--temperature {float(temperature):g}: give a number in [0.01, 100]")


def test_evaluate_without_arguments():
    assert_one_line_error(invoke("evaluate"), "--hyp", "--ref", "-m")


def test_serve_takes_the_old_max_steps_flag_with_a_note(monkeypatch, tmp_path):
    import mtkit.serving.app

    started = []
    monkeypatch.setattr(mtkit.serving.app, "run_server", lambda models, **options: started.append(options["limits"]))
    result = succeeded(invoke("serve", "-m", tmp_path, "--max-steps", 7))
    assert started[0].max_output_steps == 7
    assert result.stderr == "mtkit: --max-steps is deprecated; use --max-output-steps (the same limit)\n"
    assert "--max-steps" not in succeeded(invoke("serve", "--help")).stdout
    assert_one_line_error(invoke("serve", "-m", tmp_path, "--max-steps", 7, "--max-output-steps", 9), "--max-output-steps")


def test_the_console_entry_point_skips_the_exit_collections_and_the_app_alone_does_not(monkeypatch):
    import atexit
    import gc

    import mtkit.cli as cli

    registered, ran = [], []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(cli, "app", lambda prog_name: ran.append(prog_name))
    cli.main()
    assert registered == [gc.freeze] and ran == ["mtkit"]
    registered.clear()
    invoke("--help")  # the app run in-process (as by a program that embeds mtkit's CLI) registers nothing
    assert registered == []
