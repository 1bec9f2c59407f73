"""Shared test fixtures and helpers: small slices of the real Multi30k corpus, trained reverse-task runs, the CLI."""

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
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.config import config_from_dict
from mtkit.decoding.translator import Translator

# The fixtures that train a model or start a server or a browser: a test that uses one is slow.
SLOW_FIXTURES = {
    *("reverse_run", "reverse_rnn_run", "reverse_export", "model_run", "model_translator", "model_valid", "tagged_run"),
    *("workspace", "de_en_run", "rnn_run", "server", "browser"),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `slow` every test that uses a slow fixture (other slow tests carry the marker themselves)."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# CI explores the same (thousands of) hypothesis cases on every run; locally each run draws new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


# The first lines of Multi30k, de, en and fr ({train,val,test_2016_flickr}.{de,en,fr}.gz; tests/corpus/README.md).
MULTI30K = Path(__file__).resolve().parent / "corpus" / "multi30k"


@pytest.fixture
def multi30k_dir() -> Path:
    """The tests' slice of the gzipped Multi30k corpus (train 3,000 lines, val and test 200)."""
    return MULTI30K


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
    """A synthetic task: the target is the source's letters in reverse order.

    No letter comes twice in a source, so each next target letter is the one before the last in the
    source: a lookup that a tiny model learns to a wide margin (with repeats, "d b e e k" is ambiguous
    and a model of this size ends on the edge, where another CPU's rounding can tip an output).
    """
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name, count in (("train", train_pairs), ("valid", valid_pairs)):
        sources = [" ".join(rng.sample("abcdefghijkl", rng.randint(3, 7))) for _ in range(count)]
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
    """Write, tokenise and prepare the reverse task; returns its config (nothing trained yet).

    With `init_from` (a parent run) the parent's tokenizers are used, as `mtkit prepare` does.
    """
    from mtkit.data.prepare import prepare_corpus, train_tokenizers
    from mtkit.training.finetune import inherit_tokenizers

    write_reverse_task(directory / "raw")
    config = reverse_task_config(directory, **train)
    if config.train.init_from:
        inherit_tokenizers(config)
    else:
        train_tokenizers(config)
    prepare_corpus(config)
    return config


def tagged_task_config(directory: Path, **train: object):
    """The copy/reverse task: the same sources into `cp` (copied) and into `rv` (reversed)."""
    raw = directory / "raw"
    write_reverse_task(raw, train_pairs=2000, valid_pairs=60)
    corpora = [
        {"src": str(raw / "train.src"), "tgt": str(raw / "train.src"), "tgt_lang": "cp", "name": "copy"},
        {"src": str(raw / "train.src"), "tgt": str(raw / "train.tgt"), "tgt_lang": "rv", "name": "reverse"},
    ]
    valid = [
        {"src": str(raw / "valid.src"), "tgt": str(raw / "valid.src"), "tgt_lang": "cp"},
        {"src": str(raw / "valid.src"), "tgt": str(raw / "valid.tgt"), "tgt_lang": "rv"},
    ]
    return config_from_dict(
        {
            "name": "tagged",
            "src_lang": "xx",
            "tgt_lang": "rv",
            "data_dir": str(directory / "data"),
            "run_dir": str(directory / "run"),
            "data": {"train": corpora, "valid": valid, "test": valid, "lang_tag": "target", "langs": "zz", "drop_copies": False},
            "tokenizer": {"vocab_size": 60},
            "model": {"layers": 2, "d_model": 64, "heads": 4, "ffn_dim": 128, "dropout": 0.0},
            # Decayed to zero and validated once at the end, so best.pt is the settled model (BLEU reaches 100 early,
            # and an earlier tie would be kept): 4.3-6.7 nats past the edge over seeds 1-4 (MARGIN asks for 1).
            "train": {"batch_tokens": 1600, "lr": 0.003, "schedule": "linear", "warmup_steps": 50, "label_smoothing": 0.0,
                      "max_steps": 1000, "validate_every": 1000, "log_every": 50, "threads": 1, **train},
            "decode": {"beam": 5},  # at beam 2, two early EOS often end the search before "c b a" finishes (learned_margin),
        }
    )  # fmt: skip


def trained_past_the_edge(train_with_seed: Callable[[int], object], margin_of: Callable[[object], float], tries: int = 3):
    """A run trained with seed 1, else 2, ... whose model ends MARGIN past the edge of learning.

    Tests assert these models' exact outputs, and a run on the edge gives other outputs on a CPU whose
    kernels round differently (training takes another path). Over seeds 1-8 on one machine, about one
    run in eight of the tiny Transformer ends under MARGIN, so a fixture tries the next seed before it
    fails, naming every margin it saw.
    """
    margins = []
    for seed in range(1, tries + 1):
        config = train_with_seed(seed)
        margins.append(margin_of(config))
        if margins[-1] >= MARGIN:
            return config
    seen = ", ".join(f"{m:.2f}" for m in margins)
    pytest.fail(
        f"the {config.name} fixture ({config.model.arch}, {config.train.max_steps} updates) ended {seen} nats past the edge "
        f"of learning with seeds 1-{tries} (-inf: a search missed a reference), under the {MARGIN} its tests need; "
        "train it longer or with a decaying schedule"
    )


@pytest.fixture(scope="session")
def tagged_run(tmp_path_factory: pytest.TempPathFactory):
    """The copy/reverse task trained with target tags (the multilingual, serving and page tests)."""
    from mtkit.data.prepare import prepare_corpus, train_tokenizers
    from mtkit.training.trainer import train

    def train_with_seed(seed: int):  # noqa: ANN202 - a recipe
        config = tagged_task_config(tmp_path_factory.mktemp("tagged"), seed=seed)
        train_tokenizers(config)
        prepare_corpus(config)
        train(config)
        return config

    def margin_of(config) -> float:  # noqa: ANN001 - a recipe
        sources = [*Path(config.data.valid[0].src).read_text(encoding="utf-8").splitlines(), *REVERSE_PROBES]
        copied = learned_margin(config.run_path, sources, sources, "cp")
        return min(copied, learned_margin(config.run_path, sources, [reverse(line) for line in sources], "rv"))

    return trained_past_the_edge(train_with_seed, margin_of)


@pytest.fixture(scope="session")
def reverse_run(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Transformer trained on the reverse task (shared by the train and translate tests)."""
    from mtkit.training.trainer import train

    def train_with_seed(seed: int):  # noqa: ANN202 - a recipe
        # At the template's lr 0.003 the model hovers at 46-48 of 50 exact; a lower peak lets it settle.
        directory = tmp_path_factory.mktemp("reverse")
        config = prepared_reverse_task(directory, max_steps=750, batch_tokens=1600, lr=0.001, seed=seed)
        train(config)
        return config

    return trained_past_the_edge(train_with_seed, reversal_margin)


@pytest.fixture(scope="session")
def reverse_rnn_run(tmp_path_factory: pytest.TempPathFactory):
    """A tiny GRU with Bahdanau attention trained on the reverse task (shared by the RNN and decoding tests)."""
    from mtkit.config import ModelConfig
    from mtkit.training.trainer import train

    def train_with_seed(seed: int):  # noqa: ANN202 - a recipe
        directory = tmp_path_factory.mktemp("reverse_rnn")
        config = prepared_reverse_task(directory, max_steps=300, validate_every=150, lr=0.005, seed=seed)
        config.model = ModelConfig(arch="rnn", cell="gru", layers=1, hidden_size=64, embed_dim=32, dropout=0.0)
        train(config)
        return config

    return trained_past_the_edge(train_with_seed, reversal_margin)


@pytest.fixture(scope="session")
def reverse_export(reverse_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reverse-task Transformer exported to CTranslate2 (float32), for the export and engine tests."""
    from mtkit.exporters.ctranslate2 import export_ctranslate2

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

    from mtkit.serving.app import create_app, model_info

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


@pytest.fixture(params=["reverse_run", "reverse_rnn_run"], scope="module")
def model_run(request):
    """A trained reverse-task run of each architecture (the test runs once for each)."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def model_translator(model_run) -> Translator:
    return Translator.load(model_run.run_path, device="cpu")


@pytest.fixture(scope="module")
def model_valid(model_run) -> tuple[list[str], list[str]]:
    """The reverse task's validation sources and targets."""
    raw = model_run.data_path.parent / "raw"
    return (raw / "valid.src").read_text().splitlines(), (raw / "valid.tgt").read_text().splitlines()


@pytest.fixture
def test200(multi30k_slice) -> tuple[Path, Path]:
    """The first 200 Multi30k test2016 sentences, German and English."""
    return multi30k_slice("test_2016_flickr", "de", 200), multi30k_slice("test_2016_flickr", "en", 200)


def cli_output(*arguments: object) -> str:
    """Run an mtkit command in-process; it must succeed; its standard output."""
    result = CliRunner().invoke(app, [str(a) for a in arguments])
    assert result.exit_code == 0, result.output
    return result.stdout


def write_text_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def multi30k_recipe(
    tmp_path: Path,
    multi30k_slice: Callable[[str, str, int], Path],
    joint: bool = True,
    with_test: bool = True,
    train_lines: int = 1000,
):
    """A recipe over Multi30k slices: `train_lines` training pairs (1000), 100 validation and 100 test pairs."""

    def files(split: str, count: int) -> dict[str, str]:
        return {"src": str(multi30k_slice(split, "de", count)), "tgt": str(multi30k_slice(split, "en", count))}

    data = {"train": files("train", train_lines), "valid": files("val", 100)}
    if with_test:
        data["test"] = files("test_2016_flickr", 100)
    recipe = {"name": "tiny", "src_lang": "de", "tgt_lang": "en", "data_dir": str(tmp_path / "data"), "data": data}
    return config_from_dict({**recipe, "tokenizer": {"vocab_size": 300, "joint": joint}})


def append_lines(path: Path, lines: list[str]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(f"{line}\n" for line in lines)


# The margin, in nats, every trained fixture whose exact outputs a test asserts must end beyond.
MARGIN = 1.0
# Lines outside the validation sets whose outputs tests assert.
REVERSE_PROBES = ["a b c", "a b c d", "e f g", "d e f g h", "h i j", "a b c d e f", "g h i j k l", "l k j i h"]


def reverse(line: str) -> str:
    return " ".join(reversed(line.split()))


def reversal_margin(config) -> float:  # noqa: ANN001 - a recipe
    """`learned_margin` of a reverse-task run on its validation set and the lines tests translate."""
    raw = config.data_path.parent / "raw"
    sources = [*(raw / "valid.src").read_text(encoding="utf-8").splitlines(), *REVERSE_PROBES]
    return learned_margin(config.run_path, sources, [reverse(line) for line in sources])


def learned_margin(run_path: Path, sources: list[str], targets: list[str], tgt_lang: str | None = None) -> float:
    """How far past the edge of learning a run is: the smallest gap, in log-probability, between each
    reference token and the model's best other token, over every position of every pair, teacher-forced;
    -inf where greedy search or a beam search of the recipe's beam does not give the references.

    A wide gap does not make beam search exact by itself: a search ends once it holds K finished
    hypotheses (fairseq's rule, which CTranslate2 shares), so at beam 2 two early EOS can end it
    before the best beam finishes ("a b c" copied as "a b" by a model 10 nats sure of "c").

    Other CPUs' kernels round differently and send training down a slightly different path; a run
    whose smallest gap is a few nats gives the same greedy and beam outputs on any of them.
    """
    import torch

    from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, tagged
    from mtkit.textio import model_text

    translator = Translator.load(run_path, device="cpu")
    tokenizers, engine = translator.tokenizers, translator.engine
    source_ids = tagged([tokenizers.src.encode(model_text(s, translator.normalize)) for s in sources],
                        translator.source_tag(tgt_lang))  # fmt: skip
    target_ids = [tokenizers.tgt.encode(model_text(t, translator.normalize)) for t in targets]
    src, src_mask = engine._source(source_ids)
    tgt = torch.full((len(targets), max(map(len, target_ids)) + 1), PAD_ID, dtype=torch.long)  # (B, T)
    gold = tgt.clone()  # (B, T) the token each position predicts
    for row, target in enumerate(target_ids):
        tgt[row, : len(target) + 1] = torch.tensor([BOS_ID, *target])
        gold[row, : len(target) + 1] = torch.tensor([*target, EOS_ID])
    with torch.no_grad():
        log_probs = torch.log_softmax(engine.model(src, src_mask, tgt).float(), dim=-1)  # (B, T, V)
    reference = log_probs.gather(2, gold.unsqueeze(2)).squeeze(2)  # (B, T)
    others = log_probs.scatter(2, gold.unsqueeze(2), float("-inf")).amax(dim=2)  # (B, T)
    searched = [translator.translate(sources, beam=beam, tgt_lang=tgt_lang) for beam in (1, translator.decode.beam)]
    if any(outputs != list(targets) for outputs in searched):
        return float("-inf")
    return float((reference - others)[gold.ne(PAD_ID)].min())
