"""Tests for mtkit.config: dataclass defaults, YAML recipes, --set overrides and their errors."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

import pytest
import yaml

from mtkit.config import (
    Config,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    SplitConfig,
    TokenizerConfig,
    TrainConfig,
    TrainSource,
    arch_keys,
    choices,
    config_from_dict,
    config_to_dict,
    load_config,
    parse_duration,
)
from mtkit.errors import MtkitError
from mtkit.textio import parse_yaml

REPO = Path(__file__).resolve().parents[1]
MULTI30K_RECIPE = REPO / "recipes" / "multi30k" / "transformer.yaml"
RNN_RECIPE = REPO / "recipes" / "multi30k" / "rnn.yaml"

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
    "decode": ["beam", "length_penalty", "max_len_a", "max_len_b", "batch_beam_tokens"],
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
    assert config.data.train == [TrainSource(hf="bentrevett/multi30k", split="train")]
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
    assert config.data.train == [TrainSource(src="a.de", tgt="b.en")]  # hf and split are gone
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
        ("model.positions=rotary", "model.positions", "sinusoidal, sinusoidal_halves, learned"),
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


def test_a_parent_config_with_an_integer_past_python_s_limit_is_one_line(tmp_path):
    (tmp_path / "parent").mkdir()
    (tmp_path / "parent" / "config.yaml").write_text(f"model:\n  d_model: {'1' * 5000}\n", encoding="utf-8")
    with pytest.raises(MtkitError, match="cannot read the parent's config.yaml .*a value YAML cannot build") as caught:
        load_config(MULTI30K_RECIPE, [f"train.init_from={tmp_path / 'parent'}"])
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
    assert config.data.train == [TrainSource(hf="bentrevett/multi30k", split="train")]
    assert config.data.valid == [SplitConfig(hf="bentrevett/multi30k", split="validation")]  # a list, like data.train
    assert config.data.test == [SplitConfig(hf="bentrevett/multi30k", split="test")]  # a list, like data.train
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
    assert config.data.train == [
        TrainSource(src="../shared/data/multi30k/train.de.gz", tgt="../shared/data/multi30k/train.en.gz")
    ]


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


def load_shipped_recipe(recipe: Path, tmp_path: Path) -> Config:
    """A shipped recipe as loaded; a fine-tuning one against a stand-in for its parent: a run directory
    holding the config its parent recipe (the recipe beside it whose run it names) saves."""
    raw = parse_yaml(recipe.read_text(encoding="utf-8"))
    parent_run = (raw.get("train") or {}).get("init_from")
    if not parent_run:
        return load_config(recipe)
    parents = [other for other in recipe.parent.glob("*.yaml") if f"runs/{parse_yaml(other.read_text())['name']}" == parent_run]
    assert len(parents) == 1, f"{recipe.name}: train.init_from names no recipe of its folder"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config_to_dict(load_config(parents[0]))))
    return load_config(recipe, [f"train.init_from={tmp_path}"])


@pytest.mark.parametrize("recipe", sorted(REPO.glob("recipes/*/*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads_and_builds_its_model(recipe, tmp_path):
    from mtkit.models import build_model

    config = load_shipped_recipe(recipe, tmp_path)
    assert config.name == f"{recipe.parent.name}_{recipe.stem}"  # the Makefile's RUN=runs/multi30k_FILE
    model = build_model(
        config.model, config.tokenizer.vocab_size, tgt_vocab_size=config.tokenizer.vocab_size, share_vocab=config.tokenizer.joint
    )
    assert model.num_parameters() > 1_000_000


# Ranges, relations and architectures: the whole recipe is checked at load


@pytest.mark.parametrize(
    ("recipe", "override", "message"),
    [
        (MULTI30K_RECIPE, "model.layers=-3", "'model.layers' is -3; give a whole number in [1, 1024], such as 6"),
        (MULTI30K_RECIPE, "train.lr=-1", "'train.lr' is -1.0; give a number in (0, 10], such as 0.0007"),
        (
            MULTI30K_RECIPE,
            "tokenizer.vocab_size=0",
            "'tokenizer.vocab_size' is 0; give a whole number in [8, 1000000], such as 8000",
        ),
        (MULTI30K_RECIPE, "model.heads=7", "'model.heads' is 7; give a whole number that divides model.d_model (256), such as 8"),
        (MULTI30K_RECIPE, "train.batch_tokens=0", "'train.batch_tokens' is 0; give a whole number >= 1, such as 4096"),
        (MULTI30K_RECIPE, "train.warmup_steps=-1", "'train.warmup_steps' is -1; give a whole number >= 1, such as 4000"),
        (MULTI30K_RECIPE, "train.max_time=soon", "'train.max_time' is 'soon'; give a duration"),
        (MULTI30K_RECIPE, "decode.beam=0", "'decode.beam' is 0; give a whole number >= 1, such as 5"),
        (RNN_RECIPE, "model.hidden_size=-1", "'model.hidden_size' is -1; give a whole number >= 1, such as 512"),
        (
            RNN_RECIPE,
            "model.heads=4",
            "'model.heads' is a Transformer key but model.arch is rnn; remove it, or set model.arch=transformer",
        ),
    ],
    ids=lambda value: value.name if isinstance(value, Path) else None,
)
def test_a_bad_value_fails_at_load_in_one_line_naming_the_key(recipe, override, message):
    assert load_error(recipe, override).startswith(f"{recipe}: {message}")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.dropout=1", "'model.dropout' is 1.0; give a number in [0, 1), such as 0.1"),
        ("model.attention_dropout=-0.1", "'model.attention_dropout' is -0.1; give a number in [0, 1), such as 0.1"),
        ("train.label_smoothing=1.0", "'train.label_smoothing' is 1.0; give a number in [0, 1)"),
        ("tokenizer.character_coverage=0", "'tokenizer.character_coverage' is 0.0; give a number in (0, 1], such as 1.0"),
        ("train.ema=1", "'train.ema' is 1.0; give a number in [0, 1), such as 0.999"),
        ("train.clip_norm=-1", "'train.clip_norm' is -1.0; give a number >= 0"),
        ("train.max_nonfinite=0", "'train.max_nonfinite' is 0; give a whole number >= 1, such as 10"),
        ("train.max_steps=-5", "'train.max_steps' is -5; give a whole number >= 0, such as 10000"),
        ("train.seed=-1", "'train.seed' is -1; give a whole number in [0, 4294967295], such as 1"),
        ("train.lr=.nan", "'train.lr' is nan; give a number in (0, 10]"),
        ("train.lr=1e39", "'train.lr' is 1e+39; give a number in (0, 10]"),
        (f"train.lr={10**400}", "'train.lr' is inf; give a number in (0, 10]"),
        ("train.threads=100000", "'train.threads' is 100000; give a whole number in [0, 1024], such as 4"),
        (f"data.train.limit={2**63}", f"'data.train.limit' is {2**63}; give a whole number >= 1, such as 10000"),
        ("decode.length_penalty=-1", "'decode.length_penalty' is -1.0; give a number in [0, 10], such as 1.0"),
        ("decode.max_input_tokens=0", "'decode.max_input_tokens' is 0; give a whole number in [1, 10000], such as 250"),
        (f"train.seed={'9' * 5000}", "'train.seed' must be int"),
        ("decode.max_len_a=.inf", "'decode.max_len_a' is inf; give a number in [0, 10]"),
        ("decode.max_len_b=-1", "'decode.max_len_b' is -1; give a whole number in [0, 10000], such as 10"),
        ("data.max_ratio=0.5", "'data.max_ratio' is 0.5; give a number >= 1"),
        ("data.train.limit=0", "'data.train.limit' is 0; give a whole number >= 1"),
        ("model.max_positions=1", "'model.max_positions' is 1; give a whole number in [2, 65536]"),
        ("model.max_positions=100000000", "'model.max_positions' is 100000000; give a whole number in [2, 65536]"),
        ("train.device=gpu", "'train.device' is 'gpu'; give auto, cpu, cuda or cuda:N"),
        ("name='  '", "'name' is '  '; give a name that is not blank"),
        ("model.d_model=90", "'model.heads' is 4; give a whole number that divides model.d_model (90), such as 3"),
    ],
)
def test_every_kind_of_rule_names_the_key_the_value_and_an_example(override, message):
    assert message in load_error(MULTI30K_RECIPE, override)


@pytest.mark.parametrize(
    "override",
    [
        "model.dropout=0",
        "train.ema=0",
        "train.clip_norm=0",
        "train.max_steps=0",
        "train.patience=0",
        "train.threads=0",
        "tokenizer.character_coverage=1",
        "data.max_ratio=1",
        "decode.max_len_b=0",
        "train.seed=0",
        "train.max_time=600",
        "train.device=cuda:1",
        "model.heads=1",
        "model.heads=256",
    ],
)
def test_values_on_the_edge_of_a_range_are_accepted(override):
    load_config(MULTI30K_RECIPE, [override])


@pytest.mark.parametrize(
    ("recipe", "overrides", "message"),
    [
        (RNN_RECIPE, ["model.hidden_size=511"], "'model.hidden_size' is 511; give an even number with model.bidirectional"),
        (RNN_RECIPE, ["model.input_feed=true"], "'model.input_feed' is true; input feeding needs Luong attention"),
        (MULTI30K_RECIPE, ["model.cell=gru"], "'model.cell' is an RNN key but model.arch is transformer"),
        (MULTI30K_RECIPE, ["model.arch=rnn"], "'model.d_model' is a Transformer key but model.arch is rnn"),
    ],
)
def test_rules_between_keys_and_architectures(recipe, overrides, message):
    assert message in load_error(recipe, *overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.compile=layers"], "'train.compile' is 'layers'; an RNN has no repeated layers to compile one by one"),
        (["train.checkpoint_activations=true"], "'train.checkpoint_activations' is true; an RNN has no repeated layers"),
    ],
)
def test_levers_of_a_transformer_s_layers_are_refused_for_an_rnn_at_load(overrides, message):
    assert message in load_error(RNN_RECIPE, *overrides)
    load_config(MULTI30K_RECIPE, overrides)  # a Transformer takes them


def test_a_compile_cache_that_is_a_file_is_refused_at_load(tmp_path):
    (tmp_path / "cache").write_text("not a folder")
    assert "'train.compile_cache' is '" in load_error(MULTI30K_RECIPE, f"train.compile_cache={tmp_path / 'cache'}")
    for setting in ("auto", "false", str(tmp_path / "new-folder")):
        load_config(MULTI30K_RECIPE, [f"train.compile_cache={setting}"])


def test_relations_hold_once_fixed():
    load_config(RNN_RECIPE, ["model.hidden_size=511", "model.bidirectional=false"])
    load_config(RNN_RECIPE, ["model.input_feed=true", "model.attention=luong_dot"])


def sections_of(cls: type) -> list[type]:
    """`cls` and every dataclass nested in it, walked through the type hints."""
    found = [cls]
    for hint in typing.get_type_hints(cls).values():
        for option in typing.get_args(hint) or (hint,):
            if dataclasses.is_dataclass(option) and option not in found:
                found += sections_of(option)
    return found


def test_every_number_declares_its_range_and_every_model_key_its_architecture():
    sections = sections_of(Config)
    assert len(sections) == 10  # SyntheticDecodeConfig: a synthetic corpus's decoding; LoraConfig: train.lora
    for section in sections:
        for name, hint in typing.get_type_hints(section).items():
            if {int, float} & set(typing.get_args(hint) or (hint,)):
                assert "range" in section.__dataclass_fields__[name].metadata, f"{section.__name__}.{name} has no range"
    shared = {"arch", "layers", "dropout", "tie_embeddings"}
    assert {f.name for f in dataclasses.fields(ModelConfig) if "arch" not in f.metadata} == shared


def test_arch_keys_are_the_constructor_arguments():
    from mtkit.models.rnn import RNNSeq2Seq
    from mtkit.models.transformer import Transformer

    for arch, model in (("transformer", Transformer), ("rnn", RNNSeq2Seq)):
        parameters = set(inspect.signature(model.__init__).parameters) - {
            "self",
            "src_vocab_size",
            "tgt_vocab_size",
            "share_vocab",
            "pad_id",
        }
        assert set(arch_keys(arch)) == parameters
    assert "heads" in arch_keys("transformer") and "heads" not in arch_keys("rnn")
    assert "hidden_size" in arch_keys("rnn") and "layers" in arch_keys("rnn")


def test_choices_are_listed_once_in_config():
    assert choices(DataConfig, "normalize") == ("NFC", "NFKC", "none")
    assert choices(DataConfig, "bad_bytes") == ("error", "replace")
    assert choices(ModelConfig, "arch") == ("transformer", "rnn")
    assert choices(TrainConfig, "precision") == ("auto", "fp32", "bf16", "fp16")
    with pytest.raises(KeyError):
        choices(ModelConfig, "layers")


def test_an_rnn_config_saves_only_its_keys_and_loads_again():
    config = load_config(RNN_RECIPE)
    data = config_to_dict(config)
    assert set(data["model"]) == {"arch", *arch_keys("rnn")}
    assert config_from_dict(yaml.safe_load(yaml.safe_dump(data))) == config
    assert set(config_to_dict(load_config(MULTI30K_RECIPE))["model"]) == {"arch", *arch_keys("transformer")}


def test_an_old_saved_config_with_every_key_loads_with_saved_true():
    config = load_config(RNN_RECIPE)
    old = dataclasses.asdict(config)  # what older versions saved: all keys, and decode.nbest
    old["decode"]["nbest"] = 1
    assert config_from_dict(old, source="old.pt", saved=True) == config
    with pytest.raises(MtkitError, match="'model.d_model' is a Transformer key"):
        config_from_dict(old, source="old.pt")
    old["model"]["d_model"] = 1000  # dropped, so not even checked against heads
    assert config_from_dict(old, saved=True) == config


def test_saved_true_still_refuses_unknown_and_bad_keys():
    with pytest.raises(MtkitError, match="unknown key 'decode.beams'"):
        config_from_dict({"decode": {"beams": 2}}, saved=True)
    with pytest.raises(MtkitError, match="'model.layers' is 0"):
        config_from_dict({"model": {"layers": 0}}, saved=True)


def test_decode_nbest_is_no_recipe_key(recipe):
    assert "unknown key 'decode.nbest'" in load_error(recipe, "decode.nbest=2")


def test_several_weighted_training_corpora_load_and_round_trip():
    raw = {
        "data": {"train": [{"src": "e.de", "tgt": "e.en", "weight": 0.5, "name": "europarl"}, {"tsv": "n.tsv.gz", "weight": 2}]}
    }
    config = config_from_dict(raw)
    assert config.data.train == [
        TrainSource(src="e.de", tgt="e.en", weight=0.5, name="europarl"),
        TrainSource(tsv="n.tsv.gz", weight=2.0),
    ]
    assert config_from_dict(config_to_dict(config)) == config
    single = config_from_dict({"data": {"train": {"src": "a.de", "tgt": "a.en"}}})
    assert config_to_dict(single)["data"]["train"] == {**dataclasses.asdict(TrainSource(src="a.de", tgt="a.en"))}


@pytest.mark.parametrize(
    ("train", "message"),
    [
        (
            [{"tsv": "a", "name": "x"}, {"tsv": "b", "name": "x"}],
            "'data.train' is a list of 2; give each corpus its own name ('x' is used twice)",
        ),
        ([{"tsv": "a"}, {"tsv": "b", "weight": 0}], "'data.train[1].weight' is 0.0; give a number in (0, 1000], such as 0.5"),
        ([{"tsv": "a"}, {"tsv": "b", "wieght": 2}], "unknown key 'data.train[1].wieght'; did you mean 'data.train[1].weight'?"),
        ([], "'data.train' must be a mapping or a non-empty list of mappings, got []"),
        (
            {"tsv": "a", "name": "two words"},
            "'data.train.name' is 'two words'; give a name without spaces or commas, such as news",
        ),
    ],
)
def test_bad_training_corpora_are_one_line_errors(train, message):
    with pytest.raises(MtkitError) as caught:
        config_from_dict({"data": {"train": train}})
    assert str(caught.value) == f"config: {message}"


def test_weight_is_a_training_key_only():
    with pytest.raises(MtkitError, match="unknown key 'data.valid.weight'"):
        config_from_dict({"data": {"valid": {"tsv": "v.tsv", "weight": 2}}})


def test_the_recipe_names_a_corpus_by_its_split_and_its_place_in_a_list():
    from mtkit.config import recipe_key

    data = config_from_dict({"data": {"train": [{"tsv": "a"}, {"tsv": "b"}], "test": {"tsv": "t"}}}).data
    assert [recipe_key(data, "train", index=index) for index in range(2)] == ["data.train[0]", "data.train[1]"]
    assert (
        recipe_key(data, "valid", index=0) == "data.valid" and recipe_key(data, "test", index=0) == "data.test"
    )  # a split of one
    with pytest.raises(MtkitError, match=re.escape("but data.train.weight is 2; give either")):  # named as the rule says
        config_from_dict({"data": {"train": {"tsv": "a", "weight": 2}, "temperature": 5}})


def test_overrides_pick_one_corpus_of_a_list(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  train:\n    - {tsv: a.tsv}\n    - {tsv: b.tsv}\n", encoding="utf-8")
    assert load_config(recipe, ["data.train[1].weight=3"]).data.train[1].weight == 3.0
    with pytest.raises(MtkitError) as caught:
        load_config(recipe, ["data.train.weight=3"])
    assert (
        str(caught.value) == "--set data.train.weight: data.train is a list of 2; pick one, e.g. --set data.train[0].weight=..."
    )


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes").rglob("*.yaml")), ids=lambda path: path.name)
def test_every_shipped_recipe_loads_and_states_the_band_it_should_reach(recipe, tmp_path):
    from mtkit.config import bleu_band

    low, high = bleu_band(load_shipped_recipe(recipe, tmp_path))
    assert 0 < low < high <= 100


def test_the_renamed_decode_batch_tokens_is_read_with_a_note(capsys):
    config = config_from_dict({"decode": {"batch_tokens": 1234}}, source="old.yaml")
    assert config.decode.batch_beam_tokens == 1234 and config.train.batch_tokens == TrainConfig().batch_tokens
    note = capsys.readouterr().err.strip()
    assert note == "mtkit: note: old.yaml: 'decode.batch_tokens' is now called 'decode.batch_beam_tokens'; rename it"
    assert config_from_dict({"decode": {"batch_tokens": 99}}, saved=True).decode.batch_beam_tokens == 99
    assert capsys.readouterr().err == ""  # a config saved by an older mtkit says nothing
    with pytest.raises(MtkitError, match="'decode.batch_tokens' and 'decode.batch_beam_tokens' are one key"):
        config_from_dict({"decode": {"batch_tokens": 1, "batch_beam_tokens": 2}})


def test_the_renamed_data_temperature_is_read_with_a_note(capsys):
    config = config_from_dict({"data": {"temperature": 5}}, source="old.yaml")
    assert config.data.corpus_temperature == 5
    note = capsys.readouterr().err.strip()
    assert note == "mtkit: note: old.yaml: 'data.temperature' is now called 'data.corpus_temperature'; rename it"
    assert config_from_dict({"data": {"temperature": 2}}, saved=True).data.corpus_temperature == 2
    assert capsys.readouterr().err == ""
    with pytest.raises(MtkitError, match="'data.temperature' and 'data.corpus_temperature' are one key"):
        config_from_dict({"data": {"temperature": 5, "corpus_temperature": 2}})


def test_a_synthetic_corpus_is_checked_at_load():
    def load(entry: dict) -> Config:
        return config_from_dict({"data": {"train": [{"src": "a.de", "tgt": "a.en"}, entry]}})

    assert load({"src": "b.de", "translate_with": "runs/t", "decode": {"beam": 4}}).data.train[1].generated_side == "tgt"
    for entry, message in [
        ({"src": "b.de", "tgt": "b.en", "translate_with": "runs/t"}, "a model writes this corpus's tgt: give src"),
        ({"tgt": "m.en", "back_translate_with": "runs/r", "translate_with": "runs/t"}, "not both"),
        ({"src": "b.de", "tgt": "b.en", "decode": {"beam": 4}}, "decode says how a model writes a corpus"),
        ({"src": "b.de", "translate_with": "runs/t", "tag": "2x"}, "'data.train[1].tag' is '2x'"),
        ({"src": "b.de", "translate_with": "runs/t", "decode": {"sampling": "top"}}, "give topk:K, topp:P or full"),
        ({"src": "b.de", "translate_with": "runs/t", "decode": {"temperature": 1e-300}}, "give a number in [0.01, 100]"),
    ]:
        with pytest.raises(MtkitError, match=re.escape(message)):
            load(entry)
