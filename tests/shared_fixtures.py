"""The tests' shared fixtures, for every tier (a plugin tests/conftest.py registers in each process that runs
tests): Multi30k slices, and every fixture that trains a model or prepares a corpus (the reverse-task runs and
their exports, the copy/reverse run, the CLI's tiny run, the page's de->en run, the fine-tuned Marian child,
the synthetic corpora), plus the exporters' cache of transformers' remote code and the guard on torch's thread
count. Plain helpers and constants are in helpers.py."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import yaml
from helpers import (
    MULTI30K,
    cli_recipe,
    cli_said,
    de_en_task_config,
    invoke,
    noisy_multi30k,
    prepared_reverse_task,
    recipe,
    reversal_margin,
    reverse_task_config,
    succeeded,
    synthetic_recipe,
    tagged_margin,
    tagged_task_config,
    trained_past_the_edge,
    write_multi30k_slice,
    write_reverse_task,
    write_text_lines,
)
from hypothesis import settings

from mtkit.config import Config, ModelConfig
from mtkit.decoding.translator import Translator


@pytest.fixture(autouse=True)
def torch_threads_left_as_found() -> Iterator[None]:
    """Each test leaves torch's thread count as it found it. One that does not slows every later test of its
    worker: two OpenMP threads spin on the worker's one core (`ctranslate2.Translator` at its default
    intra_threads=0 sets the count of the thread that builds it: the two share libgomp's symbols)."""
    threads = torch.get_num_threads()
    yield
    left = torch.get_num_threads()
    if left != threads:
        torch.set_num_threads(threads)
        pytest.fail(f"the test left torch on {left} threads, not the {threads} it found: restore them")


# CI explores the same (thousands of) hypothesis cases on every run; locally each run draws new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session", autouse=True)
def compile_cache_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A compiled test run's compiler cache (train.compile_cache: auto) goes to a folder of the session's, not
    ~/.cache: set in the environment, so the tests' subprocesses see it too."""
    before = os.environ.get("MTKIT_CACHE_DIR")
    os.environ["MTKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("mtkit-cache"))
    yield
    if before is None:
        os.environ.pop("MTKIT_CACHE_DIR", None)
    else:
        os.environ["MTKIT_CACHE_DIR"] = before


# Multi30k


@pytest.fixture
def multi30k_dir() -> Path:
    """The tests' slice of the gzipped Multi30k corpus (train 3,000 lines, val and test 200)."""
    return MULTI30K


@pytest.fixture
def multi30k_slice(tmp_path: Path) -> Callable[[str, str, int], Path]:
    """Write the first `count` lines of Multi30k `split.lang` to a plain text file in tmp_path."""

    def write(split: str, lang: str, count: int) -> Path:
        return write_multi30k_slice(tmp_path / f"{split}.{count}.{lang}", split, lang, count)

    return write


@pytest.fixture
def test200(multi30k_slice) -> tuple[Path, Path]:
    """The first 200 Multi30k test2016 sentences, German and English."""
    return multi30k_slice("test_2016_flickr", "de", 200), multi30k_slice("test_2016_flickr", "en", 200)


# The reverse task, prepared and trained


@pytest.fixture(scope="session")
def reverse_task(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """The reverse task written, tokenised and prepared with the template's settings, nothing trained.

    Shared by every test that reads it: copy the config before changing it, and write nothing into it.
    """
    return prepared_reverse_task(tmp_path_factory.mktemp("reverse_task"))


@pytest.fixture(scope="session")
def reverse_run(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """A tiny Transformer trained on the reverse task (shared by the train and translate tests)."""
    from mtkit.training.trainer import train

    def train_with_seed(seed: int) -> Config:
        # At the template's lr 0.003 the model hovers at 46-48 of 50 exact; a lower peak lets it settle.
        directory = tmp_path_factory.mktemp("reverse")
        config = prepared_reverse_task(directory, max_steps=750, batch_tokens=1600, lr=0.001, seed=seed)
        train(config)
        return config

    return trained_past_the_edge(train_with_seed, reversal_margin)


@pytest.fixture(scope="session")
def reverse_rnn_run(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """A tiny GRU with Bahdanau attention trained on the reverse task (shared by the RNN, decoding and heat-map tests)."""
    from mtkit.training.trainer import train

    def train_with_seed(seed: int) -> Config:
        directory = tmp_path_factory.mktemp("reverse_rnn")
        config = prepared_reverse_task(directory, max_steps=300, validate_every=150, lr=0.005, seed=seed)
        config.model = ModelConfig(arch="rnn", cell="gru", layers=1, hidden_size=64, embed_dim=32, dropout=0.0)
        train(config)
        return config

    return trained_past_the_edge(train_with_seed, reversal_margin)


@pytest.fixture(scope="session")
def reverse_export(reverse_run: Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reverse-task Transformer exported to CTranslate2 (float32), for the export and engine tests."""
    from mtkit.exporters.ctranslate2 import export_ctranslate2

    return export_ctranslate2(reverse_run.run_path, tmp_path_factory.mktemp("ct2") / "float32", quantization=None)


@pytest.fixture(scope="module")
def reverse_pytorch(reverse_run: Config) -> Translator:
    """The reverse-task Transformer on the PyTorch engine, on the CPU (one per module: a module may change it)."""
    return Translator.load(reverse_run.run_path, device="cpu")


@pytest.fixture(scope="module")
def reverse_ct2(reverse_export: Path) -> Translator:
    """The reverse-task Transformer's CTranslate2 export, on one thread (one per module: a module may change it)."""
    from mtkit.decoding.ct2_engine import load_export

    return Translator.over(load_export(reverse_export, threads=1))


@pytest.fixture(params=["reverse_run", "reverse_rnn_run"], scope="module")
def model_run(request: pytest.FixtureRequest) -> Config:
    """A trained reverse-task run of each architecture (the test runs once for each)."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def model_translator(model_run: Config) -> Translator:
    return Translator.load(model_run.run_path, device="cpu")


@pytest.fixture(scope="module")
def model_valid(model_run: Config) -> tuple[list[str], list[str]]:
    """The reverse task's validation sources and targets."""
    raw = model_run.data_path.parent / "raw"
    return (raw / "valid.src").read_text().splitlines(), (raw / "valid.tgt").read_text().splitlines()


@pytest.fixture(scope="module")
def tiny_recipes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Transformer and a tiny RNN recipe over one prepared reverse task (300 pairs), as YAML files."""
    from mtkit.config import config_to_dict
    from mtkit.data.prepare import prepare_corpus, train_tokenizers

    directory = tmp_path_factory.mktemp("recipe_values")
    write_reverse_task(directory / "raw", train_pairs=300, valid_pairs=10)
    config = reverse_task_config(directory)
    train_tokenizers(config)
    prepare_corpus(config)
    transformer = config_to_dict(config)
    transformer["train"].update(device="cpu", threads=1)
    rnn = {**transformer, "model": {"arch": "rnn", "cell": "gru", "layers": 1, "hidden_size": 32, "embed_dim": 16}}
    paths = {"transformer": directory / "transformer.yaml", "rnn": directory / "rnn.yaml"}
    for arch, values in (("transformer", transformer), ("rnn", rnn)):
        paths[arch].write_text(yaml.safe_dump(values), encoding="utf-8")
    return paths


# Other trained runs


@pytest.fixture(scope="session")
def tagged_run(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """The copy/reverse task trained with target tags (the multilingual, serving and page tests)."""
    from mtkit.data.prepare import prepare_corpus, train_tokenizers
    from mtkit.training.trainer import train

    def train_with_seed(seed: int) -> Config:
        config = tagged_task_config(tmp_path_factory.mktemp("tagged"), seed=seed)
        train_tokenizers(config)
        prepare_corpus(config)
        train(config)
        return config

    return trained_past_the_edge(train_with_seed, tagged_margin)


@pytest.fixture(scope="session")
def cli_workspace(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The command-line tests' tiny Multi30k recipe taken through `tokenizer train`, `prepare` and `train`,
    with each command's result (the tests check that they succeeded)."""
    root = tmp_path_factory.mktemp("cli")
    recipe = root / "tiny.yaml"
    recipe.write_text(yaml.safe_dump(cli_recipe(root)), encoding="utf-8")
    results = {
        name: invoke(*args)
        for name, args in (
            ("tokenizer", ("tokenizer", "train", recipe)),
            ("prepare", ("prepare", recipe)),
            ("train", ("train", recipe)),
        )
    }
    return {
        "root": root,
        "recipe": recipe,
        "data": root / "data",
        "run": root / "runs" / "tiny",
        "corpus": root / "corpus",
        "results": results,
    }


@pytest.fixture(scope="session")
def cli_run(cli_workspace: dict) -> Path:
    """The command-line tests' trained run directory (the pipeline must have succeeded)."""
    for result in cli_workspace["results"].values():
        succeeded(result)
    return cli_workspace["run"]


@pytest.fixture(scope="module")
def de_en_run(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """A tiny German->English Transformer trained on a slice of Multi30k; returns its config."""
    from mtkit.data.prepare import prepare_corpus, train_tokenizers
    from mtkit.training.trainer import train

    config = de_en_task_config(tmp_path_factory.mktemp("de_en"))
    train_tokenizers(config)
    prepare_corpus(config)
    train(config)
    return config


@pytest.fixture(scope="module")
def noisy_corpus(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """2,000 Multi30k pairs with 50 of each kind of noise mixed in (`helpers.noisy_multi30k`), written as corpus
    files, and two tiny Transformers trained on the 2,000 clean pairs, German->English and English->German: the dual
    cross-entropy rule's models. Keys: src, tgt, pairs, where (each kind of noise's indices), forward, backward."""
    from mtkit.config import config_from_dict
    from mtkit.data.prepare import prepare_corpus, train_tokenizers
    from mtkit.training.trainer import train

    root = tmp_path_factory.mktemp("noisy_corpus")
    pairs, where = noisy_multi30k(2000, 50)
    noise = set().union(*where.values())
    clean = [pair for index, pair in enumerate(pairs) if index not in noise]
    found = {"pairs": pairs, "where": where}
    for side, lines in (("src", [s for s, _ in pairs]), ("tgt", [t for _, t in pairs])):
        found[side] = write_text_lines(root / f"noisy.{side}", lines)
    sides = {lang: write_text_lines(root / f"clean.{lang}", [pair[n] for pair in clean]) for n, lang in enumerate(("de", "en"))}
    valid = {"de": str(MULTI30K / "val.de.gz"), "en": str(MULTI30K / "val.en.gz")}
    for name, (src, tgt) in (("forward", ("de", "en")), ("backward", ("en", "de"))):
        data = {
            "train": {"src": str(sides[src]), "tgt": str(sides[tgt])},
            "valid": {"src": valid[src], "tgt": valid[tgt], "limit": 20},
        }
        config = config_from_dict(
            recipe(name, root / name, src_lang=src, tgt_lang=tgt, data=data, tokenizer={"vocab_size": 1000},
                   model={"layers": 1}, train={"batch_tokens": 2000, "max_steps": 400, "validate_every": 400})
        )  # fmt: skip
        train_tokenizers(config)
        prepare_corpus(config)
        train(config)
        found[name] = config.run_path
    return found


@pytest.fixture(scope="module")
def marian_child(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny OPUS-MT-like model, imported, then fine-tuned one update: its last.pt."""
    pytest.importorskip("transformers")
    from marian_builder import build_marian

    from mtkit.config import load_config
    from mtkit.importers.marian import import_marian
    from mtkit.training.run_data import prepare_run_data
    from mtkit.training.trainer import train

    root = tmp_path_factory.mktemp("marian_child")
    build_marian(root / "marian")
    import_marian(str(root / "marian"), root / "parent")
    raw = root / "raw"
    write_reverse_task(raw, train_pairs=200, valid_pairs=20)
    data = {
        "train": {"src": str(raw / "train.src"), "tgt": str(raw / "train.tgt")},
        "valid": {"src": str(raw / "valid.src"), "tgt": str(raw / "valid.tgt")},
        "drop_copies": False,
    }
    child = recipe("child", root, run_dir=str(root / "child"), data=data, model=None, decode=None)
    child["train"] = {"init_from": str(root / "parent"), "max_steps": 1, "validate_every": 1, "batch_tokens": 400, "threads": 1}
    (root / "child.yaml").write_text(yaml.safe_dump(child), encoding="utf-8")
    config = load_config(root / "child.yaml")
    prepare_run_data(config)
    train(config)
    return root / "child" / "last.pt"  # step 1 (best.pt is the parent, validated as step 0)


@pytest.fixture(scope="session")
def synthetic_prepared(reverse_run: Config, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The synthetic-corpus recipe (`synthetic_recipe`, the reverse run as teacher) through `tokenizer train` and
    `prepare`: its folder, its recipe and what `tokenizer train` said. A test that changes the recipe puts it back."""
    root = tmp_path_factory.mktemp("synthetic")
    recipe = synthetic_recipe(root, reverse_run.run_path)
    said = cli_said("tokenizer", "train", recipe)
    cli_said("prepare", recipe)
    return root, recipe, said


# transformers' remote code


def _forget_remote_modules() -> None:
    for name in [name for name in sys.modules if name.split(".")[0] == "transformers_modules"]:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture(scope="session")
def transformers_installed() -> None:
    """Skips the test where transformers is not installed. A fixture (`pytestmark = pytest.mark.usefixtures(
    "transformers_installed")`), not an importorskip at the top of a test file: importing transformers at
    collection took 1.4 s in every worker, also in the workers that run none of those tests."""
    pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_modules_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """transformers copies a folder's remote code into HF_MODULES_CACHE (~/.cache/huggingface/modules) and imports
    it from there: the exporters' tests (`pytestmark = pytest.mark.usefixtures("hf_modules_cache")`) keep those
    copies in a temporary folder and forget them afterwards. Without transformers, their tests are skipped."""
    dynamic_module_utils = pytest.importorskip("transformers.dynamic_module_utils")
    _forget_remote_modules()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path_factory.mktemp("hf_modules")))
        patch.setattr(sys, "path", list(sys.path))  # the cache folder is appended to it
        yield
    _forget_remote_modules()
