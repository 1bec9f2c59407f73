"""Tests for mtkit.config: dataclass defaults, YAML recipes, --set overrides and their errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from mtkit.config import (
    Config,
    DecodeConfig,
    ModelConfig,
    SplitConfig,
    TokenizerConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    parse_duration,
)
from mtkit.errors import MtkitError

REPO = Path(__file__).resolve().parents[1]
MULTI30K_RECIPE = REPO / "recipes" / "multi30k" / "transformer.yaml"

# The recipe keys the product documents, section by section.
PROMISED_KEYS = {
    "": ["name", "src_lang", "tgt_lang", "data_dir", "run_dir", "data", "tokenizer", "model", "train", "decode"],
    "data": ["train", "valid", "test"],
    "tokenizer": ["type", "vocab_size", "joint", "character_coverage"],
    "model": ["arch", "layers", "d_model", "heads", "ffn_dim", "dropout", "norm", "positions", "tie_embeddings"],
    "train": [
        "batch_tokens",
        "lr",
        "warmup_steps",
        "label_smoothing",
        "clip_norm",
        "accumulate",
        "max_steps",
        "max_epochs",
        "max_time",
        "validate_every",
        "patience",
        "seed",
        "device",
    ],
    "decode": ["beam", "length_penalty", "max_len_a", "max_len_b", "batch_tokens"],
}


def write_recipe(directory: Path, data: dict) -> Path:
    path = directory / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    """A small recipe with a data section to override."""
    return write_recipe(
        tmp_path,
        {
            "name": "tiny",
            "src_lang": "de",
            "tgt_lang": "en",
            "data": {"train": {"hf": "bentrevett/multi30k", "split": "train"}, "max_len": 80},
            "model": {"layers": 2, "d_model": 64},
            "train": {"lr": 0.001, "max_steps": 100},
        },
    )


def load_error(recipe: Path, *overrides: str) -> str:
    """The message of the MtkitError that loading `recipe` with `overrides` raises."""
    with pytest.raises(MtkitError) as caught:
        load_config(recipe, list(overrides))
    message = str(caught.value)
    assert "\n" not in message
    return message


# Defaults and loading


def test_empty_dict_gives_the_dataclass_defaults():
    config = config_from_dict({})
    assert config == Config()
    assert config.model == ModelConfig()
    assert config.train == TrainConfig()
    assert config.decode == DecodeConfig()
    assert config.tokenizer == TokenizerConfig()
    assert config.data.test is None


def test_recipe_values_replace_defaults_and_the_rest_stay(recipe):
    config = load_config(recipe)
    assert (config.name, config.src_lang, config.tgt_lang) == ("tiny", "de", "en")
    assert config.data.train == SplitConfig(hf="bentrevett/multi30k", split="train")
    assert config.data.max_len == 80
    assert config.model.layers == 2
    assert config.model.d_model == 64
    assert config.model.heads == ModelConfig().heads
    assert config.train.lr == 0.001
    assert config.train.max_steps == 100
    assert config.train.warmup_steps == TrainConfig().warmup_steps


def test_empty_recipe_file_is_all_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    assert load_config(path) == Config()


def test_data_and_run_paths_default_to_the_recipe_name():
    config = config_from_dict({"name": "wmt"})
    assert config.data_path == Path("data/wmt")
    assert config.run_path == Path("runs/wmt")
    explicit = config_from_dict({"name": "wmt", "data_dir": "/tmp/d", "run_dir": "/tmp/r"})
    assert explicit.data_path == Path("/tmp/d")
    assert explicit.run_path == Path("/tmp/r")


# Overrides


def test_set_overrides_a_scalar_and_a_nested_key(recipe):
    config = load_config(recipe, ["name=other", "train.max_steps=7", "model.d_model=32"])
    assert config.name == "other"
    assert config.train.max_steps == 7
    assert config.model.d_model == 32
    assert config.model.layers == 2  # untouched keys of an overridden section stay


def test_set_a_key_of_a_section_missing_from_the_recipe(recipe):
    config = load_config(recipe, ["decode.beam=2"])
    assert config.decode.beam == 2
    assert config.decode.length_penalty == DecodeConfig().length_penalty


def test_set_a_whole_section_replaces_it(recipe):
    config = load_config(recipe, ["data.train={src: a.de, tgt: b.en}"])
    assert config.data.train == SplitConfig(src="a.de", tgt="b.en")  # hf and split are gone
    assert config.data.max_len == 80  # sibling keys of the section stay


def test_later_overrides_win(recipe):
    assert load_config(recipe, ["train.seed=3", "train.seed=4"]).train.seed == 4


@pytest.mark.parametrize(
    ("override", "section", "key", "expected"),
    [
        ("train.warmup_steps=250", "train", "warmup_steps", 250),
        ("train.lr=0.0005", "train", "lr", 0.0005),
        ("train.lr=2", "train", "lr", 2.0),  # an int where a float is expected
        ("model.tie_embeddings=false", "model", "tie_embeddings", False),
        ("data.dedup=true", "data", "dedup", True),
        ("train.max_time=null", "train", "max_time", None),
        ("train.max_time=", "train", "max_time", None),
        ("train.max_time=90m", "train", "max_time", "90m"),
        ("train.device=cpu", "train", "device", "cpu"),
    ],
)
def test_override_values_are_parsed_as_yaml(recipe, override, section, key, expected):
    value = getattr(getattr(load_config(recipe, [override]), section), key)
    assert value == expected
    assert type(value) is type(expected)


def test_null_clears_an_optional_top_level_key(recipe):
    config = load_config(recipe, ["data_dir=somewhere", "run_dir=null"])
    assert config.data_dir == "somewhere"
    assert config.run_dir is None


def test_numbers_are_accepted_where_strings_are_expected(recipe):
    config = load_config(recipe, ["name=2024", "train.max_time=600"])
    assert config.name == "2024"
    assert config.train.max_time == "600"
    assert parse_duration(config.train.max_time) == 600


def test_exponent_notation_is_a_float(recipe):
    assert load_config(recipe, ["train.lr=1e-3"]).train.lr == pytest.approx(0.001)


# Errors


@pytest.mark.parametrize(
    ("override", "unknown", "suggestion"),
    [
        ("nmae=x", "nmae", "name"),
        ("train.batch_token=5", "train.batch_token", "train.batch_tokens"),
        ("model.d_modle=32", "model.d_modle", "model.d_model"),
        ("decode.beams=4", "decode.beams", "decode.beam"),
        ("data.train={src: a, tgz: b}", "data.train.tgz", "data.train.tgt"),
    ],
)
def test_unknown_key_names_the_closest_valid_key(recipe, override, unknown, suggestion):
    message = load_error(recipe, override)
    assert f"unknown key '{unknown}'" in message
    assert f"did you mean '{suggestion}'" in message
    assert str(recipe) in message


def test_unknown_key_in_the_recipe_file_is_an_error(tmp_path):
    path = write_recipe(tmp_path, {"train": {"max_step": 10}})
    message = load_error(path)
    assert "'train.max_step'" in message
    assert "did you mean 'train.max_steps'" in message


def test_unknown_key_without_a_close_match_lists_the_valid_keys(recipe):
    message = load_error(recipe, "decode.zzzzzz=1")
    assert "'decode.zzzzzz'" in message
    assert "valid keys:" in message
    assert "beam" in message


@pytest.mark.parametrize(
    ("override", "key", "detail"),
    [
        ("model.layers=abc", "model.layers", "must be int"),
        ("model.layers=2.5", "model.layers", "must be int"),
        ("model.layers=true", "model.layers", "must be int"),
        ("train.lr=fast", "train.lr", "must be float"),
        ("data.dedup=3", "data.dedup", "must be bool"),
        ("model.layers=null", "model.layers", "cannot be empty"),
        ("train=5", "train", "must be a mapping"),
        ("name=[a, b]", "name", "must be str"),
    ],
)
def test_wrong_types_name_the_key(recipe, override, key, detail):
    message = load_error(recipe, override)
    assert f"'{key}'" in message
    assert detail in message


@pytest.mark.parametrize(
    ("override", "key", "choices"),
    [
        ("model.norm=mid", "model.norm", "pre, post"),
        ("model.positions=rotary", "model.positions", "sinusoidal, learned"),
        ("tokenizer.type=wordpiece", "tokenizer.type", "bpe, unigram"),
        ("data.normalize=NFD", "data.normalize", "NFC, NFKC, none"),
        ("train.precision=fp8", "train.precision", "auto, fp32, bf16, fp16"),
    ],
)
def test_invalid_choices_list_the_valid_ones(recipe, override, key, choices):
    message = load_error(recipe, override)
    assert f"'{key}'" in message
    assert f"choose one of {choices}" in message


@pytest.mark.parametrize("override", ["train.max_steps", "=5", " =5"])
def test_override_without_key_or_value_is_an_error(recipe, override):
    message = load_error(recipe, override)
    assert "expected KEY=VALUE" in message


def test_missing_recipe_file_is_an_error(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(MtkitError, match="recipe not found") as caught:
        load_config(missing)
    assert str(missing) in str(caught.value)


def test_invalid_yaml_is_a_one_line_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("train:\n  lr: [0.1\n  max_steps: 3\n", encoding="utf-8")
    with pytest.raises(MtkitError, match="not valid YAML") as caught:
        load_config(path)
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_recipe_that_is_not_a_mapping_is_an_error(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(MtkitError, match="must be a mapping"):
        load_config(path)


# The shipped recipe


def test_multi30k_recipe_loads_with_the_promised_schema():
    config = load_config(MULTI30K_RECIPE)
    for section, keys in PROMISED_KEYS.items():
        node = getattr(config, section) if section else config
        names = {f.name for f in dataclasses.fields(node)}
        assert set(keys) <= names, f"{section or 'recipe'} lacks {set(keys) - names}"
    assert {f.name for f in dataclasses.fields(SplitConfig)} >= {"src", "tgt", "hf", "split"}
    assert (config.name, config.src_lang, config.tgt_lang) == ("multi30k_transformer", "de", "en")
    assert config.data.train == SplitConfig(hf="bentrevett/multi30k", split="train")
    assert config.data.valid == SplitConfig(hf="bentrevett/multi30k", split="validation")
    assert config.data.test == SplitConfig(hf="bentrevett/multi30k", split="test")
    assert (config.model.arch, config.model.layers, config.model.d_model, config.model.heads) == ("transformer", 3, 256, 4)
    assert config.tokenizer.joint and config.model.tie_embeddings
    assert parse_duration(config.train.max_time) == 85 * 60
    assert config.data_path == Path("data/multi30k_transformer")
    assert config.run_path == Path("runs/multi30k_transformer")


def test_multi30k_recipe_accepts_the_offline_override_from_its_comment():
    config = load_config(
        MULTI30K_RECIPE,
        ["data.train={src: ../shared/data/multi30k/train.de.gz, tgt: ../shared/data/multi30k/train.en.gz}"],
    )
    assert config.data.train == SplitConfig(src="../shared/data/multi30k/train.de.gz", tgt="../shared/data/multi30k/train.en.gz")


# Durations and round trips


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90m", 5400.0), ("2h", 7200.0), ("30s", 30.0), ("15", 15.0), ("1.5h", 5400.0), ("1d", 86400.0), (" 10m ", 600.0)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", [None, "", "  "])
def test_parse_duration_of_nothing_is_no_limit(text):
    assert parse_duration(text) is None


@pytest.mark.parametrize("text", ["abc", "10 minutes", "5x", "-3m", "m"])
def test_parse_duration_rejects_bad_text(text):
    with pytest.raises(MtkitError, match="train.max_time") as caught:
        parse_duration(text)
    assert "\n" not in str(caught.value)


def test_config_dict_round_trip(recipe):
    config = load_config(recipe, ["data.test={src: t.de, tgt: t.en}", "train.max_time=2h", "model.norm=post"])
    data = config_to_dict(config)
    assert data["model"]["norm"] == "post"
    assert data["data"]["test"] == dataclasses.asdict(SplitConfig(src="t.de", tgt="t.en"))
    assert config_from_dict(data) == config
    # The saved form survives YAML, as in a run directory's config.yaml.
    assert config_from_dict(yaml.safe_load(yaml.safe_dump(data))) == config


def test_default_config_round_trips():
    assert config_from_dict(config_to_dict(Config())) == Config()


@pytest.mark.parametrize("recipe", sorted(REPO.glob("recipes/*/*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads_and_builds_its_model(recipe):
    from mtkit.models import build_model

    config = load_config(recipe)
    assert config.name == f"{recipe.parent.name}_{recipe.stem}"  # the Makefile's RUN=runs/multi30k_FILE
    model = build_model(config.model, config.tokenizer.vocab_size, config.tokenizer.vocab_size, config.tokenizer.joint)
    assert model.num_parameters() > 1_000_000
