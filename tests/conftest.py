"""Shared test fixtures: small slices of the real Multi30k corpus."""

from __future__ import annotations

import contextlib
import gzip
import itertools
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

# CI explores the same (thousands of) hypothesis cases on every run; locally each run draws new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def multi30k_dir() -> Path:
    """The gzipped Multi30k corpus ({train,val,test_2016_flickr}.{de,en,fr}.gz), kept next to the repository."""
    directory = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
    assert directory.is_dir(), f"{directory} is missing; clone the repository next to shared/"
    return directory


@pytest.fixture
def multi30k_slice(tmp_path: Path, multi30k_dir: Path) -> Callable[[str, str, int], Path]:
    """Write the first `count` lines of Multi30k `split.lang` to a plain text file in tmp_path."""

    def write(split: str, lang: str, count: int) -> Path:
        source = multi30k_dir / f"{split}.{lang}.gz"
        with gzip.open(source, "rt", encoding="utf-8") as handle:
            text = "".join(itertools.islice(handle, count))
        path = tmp_path / f"{split}.{count}.{lang}"
        path.write_text(text, encoding="utf-8")
        return path

    return write


def write_reverse_task(directory: Path, train_pairs: int = 3000, valid_pairs: int = 50, seed: int = 0) -> None:
    """A synthetic task: the target is the source's letters in reverse order."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name, count in (("train", train_pairs), ("valid", valid_pairs)):
        sources = [" ".join(rng.choice("abcdefghijkl") for _ in range(rng.randint(3, 7))) for _ in range(count)]
        (directory / f"{name}.src").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
        (directory / f"{name}.tgt").write_text("".join(" ".join(reversed(s.split())) + "\n" for s in sources), encoding="utf-8")


def reverse_task_config(directory: Path, **train: object):
    """A recipe for the reverse task with a tiny Transformer, data and run inside `directory`."""
    from mtkit.config import config_from_dict

    return config_from_dict(
        {
            "name": "reverse",
            "data_dir": str(directory / "data"),
            "run_dir": str(directory / "run"),
            "data": {
                "train": {"src": str(directory / "raw/train.src"), "tgt": str(directory / "raw/train.tgt")},
                "valid": {"src": str(directory / "raw/valid.src"), "tgt": str(directory / "raw/valid.tgt")},
                "drop_copies": False,
            },
            "tokenizer": {"vocab_size": 40},
            "model": {"layers": 2, "d_model": 64, "heads": 4, "ffn_dim": 128, "dropout": 0.0},
            "train": {
                "batch_tokens": 800,
                "lr": 0.003,
                "warmup_steps": 50,
                "label_smoothing": 0.0,
                "max_steps": 500,
                "validate_every": 250,
                "log_every": 50,
                "threads": 1,
                **train,
            },
            "decode": {"beam": 2},
        }
    )


def prepared_reverse_task(directory: Path, **train: object):
    """Write, tokenise and prepare the reverse task; returns its config (nothing trained yet)."""
    from mtkit.prepare import prepare_corpus, train_tokenizers

    write_reverse_task(directory / "raw")
    config = reverse_task_config(directory, **train)
    train_tokenizers(config)
    prepare_corpus(config)
    return config


@pytest.fixture(scope="session")
def reverse_run(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Transformer trained on the reverse task (shared by the train and translate tests)."""
    from mtkit.train import train

    # At the template's lr 0.003 the model hovers at 46-48 of 50 exact; a lower peak lets it settle.
    config = prepared_reverse_task(tmp_path_factory.mktemp("reverse"), max_steps=750, batch_tokens=1600, lr=0.001)
    train(config)
    return config


@pytest.fixture(scope="session")
def reverse_rnn_run(tmp_path_factory: pytest.TempPathFactory):
    """A tiny GRU with Bahdanau attention trained on the reverse task (shared by the RNN and decoding tests)."""
    from mtkit.config import ModelConfig
    from mtkit.train import train

    config = prepared_reverse_task(tmp_path_factory.mktemp("reverse_rnn"), max_steps=300, validate_every=150, lr=0.005)
    config.model = ModelConfig(arch="rnn", cell="gru", layers=1, hidden_size=64, embed_dim=32, dropout=0.0)
    train(config)
    return config


@pytest.fixture(scope="session")
def reverse_export(reverse_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reverse-task Transformer exported to CTranslate2 (float32), for the export and engine tests."""
    from mtkit.export import export_ctranslate2

    return export_ctranslate2(reverse_run.run_path, tmp_path_factory.mktemp("ct2") / "float32", None)


def free_port() -> int:
    """A loopback port nobody listens on now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serving(translator, limits, name: str = "model"):  # noqa: ANN001, ANN201 - a test helper
    """`mtkit serve`'s app over `translator` on a free loopback port, in a background thread; yields (port, app)."""
    import threading
    import time

    import uvicorn

    from mtkit.serve import create_app, model_info

    port = free_port()
    app = create_app(translator, limits, model_info(translator, name))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield port, app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
