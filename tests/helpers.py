"""The tests' plain helpers and constants (no fixtures, no hooks; those are in shared_fixtures.py and conftest.py).

Corpus files (Multi30k slices, the synthetic reverse and copy/reverse tasks, their recipes), how far
a trained run is past the edge of learning, running `mtkit` commands in-process, `mtkit serve` on a
loopback port with an HTTP client, and a small random Transformer. Test files import them with
`from helpers import ...` (pyproject.toml puts tests/ on pytest's path).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gzip
import http.client
import itertools
import json
import os
import random
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import Result
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.config import Config, config_from_dict
from mtkit.data.tokenizer import PAD_ID
from mtkit.decoding.translator import Translator
from mtkit.models.transformer import Transformer
from mtkit.training.fused_loss import output_layer_loss

if TYPE_CHECKING:
    from fastapi import FastAPI

    from mtkit.evaluation.comet.scorer import CometScorer
    from mtkit.serving.app import ServeLimits

# The first lines of Multi30k, de, en and fr ({train,val,test_2016_flickr}.{de,en,fr}.gz; tests/corpus/README.md).
MULTI30K = Path(__file__).resolve().parent / "corpus" / "multi30k"
# The fixtures that train a model or start a server or a browser: a test that uses one is slow.
SLOW_FIXTURES = {
    *("reverse_run", "reverse_rnn_run", "reverse_export", "model_run", "model_translator", "model_valid", "tagged_run"),
    *("cli_workspace", "de_en_run", "marian_child", "server", "browser", "noisy_corpus"),
}
# The folders of the slow tiers: end-to-end commands and trained models; processes, servers and browsers.
SLOW_TIERS = ("integration", "system")
# The margin, in nats, every trained fixture whose exact outputs a test asserts must end beyond.
MARGIN = 1.0
# The first seed a trained fixture tries (`trained_past_the_edge`): MTKIT_TEST_FIRST_SEED=4 trains every fixture with
# seeds 4, 5 and 6 instead of 1-3, to check that the tests hold for other seeds too.
FIRST_SEED = int(os.environ.get("MTKIT_TEST_FIRST_SEED", "1"))
# Lines outside the validation sets whose outputs tests assert. Each has 3-7 distinct letters, as every training
# source has: a shorter line is outside what the models learned, so its output is whatever the kernels round to.
REVERSE_PROBES = ["a b c", "a b c d", "e f g", "d e f g h", "h i j", "a b c d e f", "g h i j k l", "l k j i h", "l k j i"]
# The beams whose outputs tests assert on the reverse-task Transformer and GRU (besides the recipe's): a search of K
# ends once it holds K finished hypotheses, so each width is checked to give the references (`reversal_margin`).
SEARCHED_BEAMS = (1, 2, 3, 4)
# The updates of the command-line tests' tiny Multi30k run (`cli_recipe`).
CLI_RECIPE_STEPS = 30
# The source and target vocabulary of `small_transformer`.
SMALL_VOCAB = 40


# The source files, as the tests that read them see them


@functools.cache  # each file parsed once in a worker, for all the tests that read the sources (they only read the trees)
def source_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


# Corpus files and recipes


def write_multi30k_slice(path: Path, split: str, lang: str, count: int) -> Path:
    """Write the first `count` lines of Multi30k `split.lang` to the plain text file `path`."""
    with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as handle:
        text = "".join(itertools.islice(handle, count))
    path.write_text(text, encoding="utf-8")
    return path


def write_text_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def append_lines(path: Path, lines: list[str]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(f"{line}\n" for line in lines)


# The tiny Transformer and its training that `recipe` starts from (the reverse task's).
TINY_MODEL = {"layers": 2, "d_model": 64, "heads": 4, "ffn_dim": 128, "dropout": 0.0}
TINY_TRAINING = {"batch_tokens": 800, "lr": 0.003, "warmup_steps": 50, "label_smoothing": 0.0, "max_steps": 500,
                 "validate_every": 250, "log_every": 50, "threads": 1}  # fmt: skip


def merged(base: dict, changes: dict) -> dict:
    """A copy of `base` with `changes` deep-merged: a dict merges into a dict, None removes the key, any other value
    replaces it (the copy shares no dict with `base`, so a caller may change it)."""
    result = {key: merged(value, {}) if isinstance(value, dict) else value for key, value in base.items()}
    for key, value in changes.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def recipe(name: str, directory: Path, **sections: object) -> dict:
    """The tests' one recipe builder: data in directory/data and the run in directory/run, the tiny Transformer
    (TINY_MODEL) trained on one thread (TINY_TRAINING), beam 2, with `sections` deep-merged over them (`merged`:
    `model={"layers": 1}` changes one key, `decode=None` leaves the section out)."""
    base = {"name": name, "data_dir": str(directory / "data"), "run_dir": str(directory / "run")}
    return merged({**base, "model": TINY_MODEL, "train": TINY_TRAINING, "decode": {"beam": 2}}, sections)


def multi30k_recipe(
    tmp_path: Path,
    multi30k_slice: Callable[[str, str, int], Path],
    joint: bool = True,
    with_test: bool = True,
    train_lines: int = 1000,
) -> Config:
    """A recipe over Multi30k slices: `train_lines` training pairs (1000), 100 validation and 100 test pairs."""

    def files(split: str, count: int) -> dict[str, str]:
        return {"src": str(multi30k_slice(split, "de", count)), "tgt": str(multi30k_slice(split, "en", count))}

    data = {"train": files("train", train_lines), "valid": files("val", 100)}
    if with_test:
        data["test"] = files("test_2016_flickr", 100)
    nothing_trained = {"run_dir": None, "model": None, "train": None, "decode": None}
    tokenizer = {"vocab_size": 300, "joint": joint}
    values = recipe("tiny", tmp_path, src_lang="de", tgt_lang="en", data=data, tokenizer=tokenizer, **nothing_trained)
    return config_from_dict(values)


def cli_recipe(root: Path) -> dict:
    """The command-line tests' recipe: 1500 Multi30k pairs in root/corpus, a 1-layer, 32-wide Transformer."""
    corpus = root / "corpus"
    corpus.mkdir(exist_ok=True)

    def files(split: str, count: int) -> dict[str, str]:
        paths = [write_multi30k_slice(corpus / f"{split}.{lang}", split, lang, count) for lang in ("de", "en")]
        return {"src": str(paths[0]), "tgt": str(paths[1])}

    return recipe(
        "tiny",
        root,
        src_lang="de",
        tgt_lang="en",
        run_dir=str(root / "runs" / "tiny"),
        data={"train": files("train", 1500), "valid": files("val", 60), "test": files("test_2016_flickr", 60)},
        tokenizer={"type": "bpe", "vocab_size": 500, "joint": True},
        model={"layers": 1, "d_model": 32, "heads": 2, "ffn_dim": 64, "dropout": 0.1},
        train={"batch_tokens": 1000, "warmup_steps": 5, "label_smoothing": None, "max_steps": CLI_RECIPE_STEPS,
               "validate_every": 15, "log_every": 5, "device": "cpu"},
        decode={"beam": 3, "max_len_b": 5},
    )  # fmt: skip


def de_en_task_config(directory: Path) -> Config:
    """A tiny German->English Transformer recipe over the first 3,000 Multi30k pairs (the page's browser test)."""
    data = {
        "train": {"src": str(MULTI30K / "train.de.gz"), "tgt": str(MULTI30K / "train.en.gz"), "limit": 3000},
        "valid": {"src": str(MULTI30K / "val.de.gz"), "tgt": str(MULTI30K / "val.en.gz"), "limit": 20},
    }
    train = {"batch_tokens": 2000, "validate_every": 500, "log_every": 100}
    return config_from_dict(
        recipe("de_en_tiny", directory, src_lang="de", tgt_lang="en", data=data, tokenizer={"vocab_size": 1000},
               model={"layers": 1}, train=train)
    )  # fmt: skip


def write_log(run: Path, bleu_gain: float) -> Path:
    """A log.jsonl like `mtkit train` writes: loss windows every 50 updates, a validation every 100."""
    run.mkdir(parents=True)
    records = []
    for step in range(50, 401, 50):
        records.append({"step": step, "epoch": 1, "train_loss": 8 - step / 100, "lr": 1e-3, "tokens_per_s": 2500.0})
        if step % 100 == 0:
            bleu = bleu_gain * step / 100
            records.append({"step": step, "epoch": 1, "valid_loss": 5 - step / 200, "valid_bleu": bleu, "elapsed_s": 3 * step})
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


# The README's five-minute tour

# The heading the tour's commands come after in README.md.
TOUR_HEADING = "## A five-minute tour"


def tour_commands(readme: str) -> str:
    """The first ```sh block after the tour's heading."""
    section = readme.split(TOUR_HEADING, 1)[1]
    block = re.search(r"^```sh\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert block, f"no ```sh block under {TOUR_HEADING!r} in README.md"
    return block.group(1)


# The reverse task


def reverse(line: str) -> str:
    return " ".join(reversed(line.split()))


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
        (directory / f"{name}.tgt").write_text("".join(reverse(s) + "\n" for s in sources), encoding="utf-8")


def reverse_task_config(directory: Path, **train: object) -> Config:
    """A recipe for the reverse task with a tiny Transformer, data and run inside `directory`."""
    data = {
        "train": {"src": str(directory / "raw/train.src"), "tgt": str(directory / "raw/train.tgt")},
        "valid": {"src": str(directory / "raw/valid.src"), "tgt": str(directory / "raw/valid.tgt")},
        "drop_copies": False,
    }
    return config_from_dict(recipe("reverse", directory, data=data, tokenizer={"vocab_size": 40}, train=train))


def prepared_reverse_task(directory: Path, **train: object) -> Config:
    """Write, tokenise and prepare the reverse task; returns its config (nothing trained yet).

    With `init_from` (a parent run) the parent's tokenizers are used, as `mtkit prepare` does.
    """
    from mtkit.data.prepare import train_tokenizers
    from mtkit.training.run_data import prepare_run_data

    write_reverse_task(directory / "raw")
    config = reverse_task_config(directory, **train)
    if not config.train.init_from:
        train_tokenizers(config)
    prepare_run_data(config)
    return config


def tagged_task_config(directory: Path, **train: object) -> Config:
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
    data = {"train": corpora, "valid": valid, "test": valid, "lang_tag": "target", "langs": "zz", "drop_copies": False}
    # Decayed to zero and validated once at the end, so best.pt is the settled model (BLEU reaches 100 early,
    # and an earlier tie would be kept): 4.9, 2.0 and 4.6 nats past the edge with seeds 1-3 (MARGIN asks for 1;
    # at 600 updates seed 1 ends 1.2 past it).
    schedule = {"batch_tokens": 1600, "schedule": "linear", "max_steps": 800, "validate_every": 800}
    # Beam 5: at beam 2, two early EOS often end the search before "c b a" finishes (learned_margin).
    return config_from_dict(
        recipe("tagged", directory, src_lang="xx", tgt_lang="rv", data=data, tokenizer={"vocab_size": 60},
               train={**schedule, **train}, decode={"beam": 5})
    )  # fmt: skip


def synthetic_recipe(root: Path, teacher: Path, pairs: int = 1_500, **changes: object) -> Path:
    """original pairs, the teacher's translations of the same sources, and tagged back-translations of the targets."""
    raw = root / "raw"
    if not raw.is_dir():
        write_reverse_task(raw, train_pairs=pairs, valid_pairs=20, seed=7)
    data = {
        "train": [
            {"src": str(raw / "train.src"), "tgt": str(raw / "train.tgt"), "name": "original", "limit": 300},
            {"src": str(raw / "train.src"), "translate_with": str(teacher), "name": "distilled", "decode": {"beam": 2}},
            {"tgt": str(raw / "train.tgt"), "back_translate_with": str(teacher), "name": "bt", "tag": "bt", "weight": 0.5},
        ],
        "valid": {"src": str(raw / "valid.src"), "tgt": str(raw / "valid.tgt")},
        "drop_copies": False,
        "dedup": False,
    }
    model = {"layers": 1, "d_model": 32, "heads": 2, "ffn_dim": 64, "dropout": None}
    built = recipe("student", root, data=data, tokenizer={"vocab_size": 40}, model=model, decode=None)
    built["train"] = {"max_steps": 10, "validate_every": 10, "threads": 1}  # its own, in place of TINY_TRAINING
    for key, value in changes.items():
        section, name = key.split(".", 1) if "." in key else (key, None)
        if name is None:
            built[section] = value
        elif section == "distilled":
            built["data"]["train"][1][name] = value
        else:
            built[section][name] = value
    path = root / "student.yaml"
    path.write_text(yaml.safe_dump(built), encoding="utf-8")
    return path


# The edge of learning


def trained_past_the_edge(
    train_with_seed: Callable[[int], Config], margin_of: Callable[[Config], float], tries: int = 3
) -> Config:
    """A run trained with seed FIRST_SEED (1), else the next, ... whose model ends MARGIN past the edge of learning.

    Tests assert these models' exact outputs, and a run on the edge gives other outputs on a CPU whose
    kernels round differently (training takes another path). Over seeds 1-8 on one machine, about one
    run in eight of the tiny Transformer ends under MARGIN, so a fixture tries the next seed before it
    fails, naming every margin it saw.
    """
    margins = []
    seeds = range(FIRST_SEED, FIRST_SEED + tries)
    for seed in seeds:
        config = train_with_seed(seed)
        margins.append(margin_of(config))
        if margins[-1] >= MARGIN:
            return config
    seen = ", ".join(f"{m:.2f}" for m in margins)
    pytest.fail(
        f"the {config.name} fixture ({config.model.arch}, {config.train.max_steps} updates) ended {seen} nats past the edge "
        f"of learning with seeds {seeds[0]}-{seeds[-1]} (-inf: a search missed a reference), under the {MARGIN} its tests need; "
        "train it longer or with a decaying schedule"
    )


def reversal_margin(config: Config, beams: tuple[int, ...] = SEARCHED_BEAMS) -> float:
    """`learned_margin` of a reverse-task run on its validation set and the lines tests translate, searched with
    `beams` and the recipe's beam."""
    raw = config.data_path.parent / "raw"
    sources = [*(raw / "valid.src").read_text(encoding="utf-8").splitlines(), *REVERSE_PROBES]
    return learned_margin(config.run_path, sources, [reverse(line) for line in sources], beams=beams)


def tagged_margin(config: Config) -> float:
    """`learned_margin` of a copy/reverse run, the smaller of its two directions (`cp` and `rv`)."""
    sources = [*Path(config.data.valid[0].src).read_text(encoding="utf-8").splitlines(), *REVERSE_PROBES]
    copied = learned_margin(config.run_path, sources, sources, "cp")
    return min(copied, learned_margin(config.run_path, sources, [reverse(line) for line in sources], "rv"))


def learned_margin(
    run_path: Path, sources: list[str], targets: list[str], tgt_lang: str | None = None, *, beams: tuple[int, ...] = (1,)
) -> float:
    """How far past the edge of learning a run is: the smallest gap, in log-probability, between each
    reference token and the model's best other token, over every position of every pair, teacher-forced;
    -inf where a search of one of `beams` or of the recipe's beam does not give the references.

    A wide gap does not make beam search exact by itself: a search ends once it holds K finished
    hypotheses (fairseq's rule, which CTranslate2 shares), so at beam 2 two early EOS can end it
    before the best beam finishes ("a b c" copied as "a b" by a model 10 nats sure of "c").

    Other CPUs' kernels round differently and send training down a slightly different path; a run
    whose smallest gap is a few nats gives the same greedy and beam outputs on any of them.
    """
    from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, tagged
    from mtkit.textio import model_text

    translator = Translator.load(run_path, device="cpu")
    tokenizers, engine = translator.tokenizers, translator.engine
    source_ids = tagged([tokenizers.src.encode(model_text(s, translator.normalize)) for s in sources],
                        translator.language_tag(tgt_lang))  # fmt: skip
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
    widths = sorted({*beams, translator.decode.beam})
    searched = [translator.translate(sources, beam=beam, tgt_lang=tgt_lang) for beam in widths]
    if any(outputs != list(targets) for outputs in searched):
        return float("-inf")
    return float((reference - others)[gold.ne(PAD_ID)].min())


# The command line, in-process


def torchrun_mtkit(processes: int, *mtkit_arguments: object) -> list[str]:
    """`torchrun --standalone --nproc_per_node N -m mtkit ...` with this interpreter, as a command to run."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    return [*torchrun, "-m", "mtkit", *(str(argument) for argument in mtkit_arguments)]


def invoke(*args: object, input: str | bytes | None = None) -> Result:
    """Run an mtkit command in-process (through Typer's CliRunner)."""
    return CliRunner().invoke(app, [str(arg) for arg in args], input=input)


def succeeded(result: Result) -> Result:
    """`result`, after checking the command exited 0 (showing its output and exception if not)."""
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.output}\n{result.exception!r}"
    return result


def stdout_lines(result: Result) -> list[str]:
    """A command's standard output as lines (it must end with a newline, unless empty)."""
    assert result.stdout.endswith("\n") or result.stdout == ""
    return result.stdout.split("\n")[:-1]


def cli_output(*arguments: object) -> str:
    """Run an mtkit command in-process; it must succeed; its standard output."""
    return succeeded(invoke(*arguments)).stdout


def cli_said(*arguments: object) -> str:
    """Run an mtkit command in-process; it must succeed; everything it printed, standard output and error."""
    return succeeded(invoke(*arguments)).output


def assert_one_line_error(result: Result, *needles: str) -> str:
    """The command failed with one `mtkit: error:` line on stderr naming every needle, and no traceback."""
    assert result.exit_code == 2, f"exit {result.exit_code}: {result.output} {result.exception!r}"
    # An exception other than the clean exit would be a traceback outside CliRunner.
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    message = result.stderr.strip()
    assert "\n" not in message, message
    assert message.startswith("mtkit: error: "), message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    assert result.stdout == ""
    return message


# `mtkit serve` on loopback


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serving(
    translator: Translator, limits: ServeLimits, name: str = "model", comet: CometScorer | None = None
) -> Iterator[tuple[int, FastAPI]]:
    """`mtkit serve`'s app over `translator` (and the COMET model of `rerank`, if any) on a free loopback port, in a
    background thread; yields (port, app)."""
    import uvicorn

    from mtkit.serving.app import create_app, model_info

    port = free_port()
    web_app = create_app(translator, limits, info=model_info(translator, name), comet=comet)
    server = uvicorn.Server(uvicorn.Config(web_app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield port, web_app
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@dataclass
class Reply:
    status: int
    body: dict
    headers: dict[str, str]


def request(port: int, method: str, path: str, body: object = None, headers: dict | None = None) -> Reply:
    """One HTTP request to the server on `port`; a JSON body is sent and read as JSON, a page as {"html": ...}."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    connection.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    raw = response.read()
    connection.close()
    parsed = json.loads(raw) if response.getheader("content-type", "").startswith("application/json") else {"html": raw.decode()}
    return Reply(response.status, parsed, {k.lower(): v for k, v in response.getheaders()})


def translate(port: int, lines: list[str], **options: object) -> Reply:
    """POST /translate with `lines` and the request's other fields."""
    return request(port, "POST", "/translate", {"text": lines, **options})


# A small random Transformer


def small_transformer(**overrides: object) -> Transformer:
    """A 2-layer, 32-wide Transformer in eval mode, seeded: the same weights on every call."""
    torch.manual_seed(0)
    arguments = dict(layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0)
    arguments.update(overrides)
    return Transformer(SMALL_VOCAB, SMALL_VOCAB, **arguments).eval()


def random_batch(batch: int = 3, src_len: int = 7, tgt_len: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random source and target ids (no padding) and the all-true source mask: (src, src_mask, tgt)."""
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, SMALL_VOCAB, (batch, src_len), generator=generator)
    tgt = torch.randint(4, SMALL_VOCAB, (batch, tgt_len), generator=generator)
    return src, torch.ones_like(src, dtype=torch.bool), tgt


# The fused loss (its unit tests and the compiled check in tests/integration/training/)

# The rows, width and vocabulary of `loss_inputs`.
LOSS_ROWS, LOSS_DIM, LOSS_VOCAB = 24, 16, 50


def loss_inputs(dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """hidden (N, D), weight (V, D), bias (V,), target (N,) with pad rows, and ids for the weight as an embedding."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(LOSS_ROWS, LOSS_DIM, generator=generator, dtype=torch.float64).to(dtype)
    weight = (0.5 * torch.randn(LOSS_VOCAB, LOSS_DIM, generator=generator, dtype=torch.float64)).to(dtype)
    bias = torch.randn(LOSS_VOCAB, generator=generator, dtype=torch.float64).to(dtype)
    target = torch.randint(1, LOSS_VOCAB, (LOSS_ROWS,), generator=generator)
    target[[3, 10, 11, LOSS_ROWS - 1]] = PAD_ID
    return hidden, weight, bias, target, torch.randint(0, LOSS_VOCAB, (40,), generator=generator)


def plain_loss(hidden, weight, bias, target, smoothing):
    logits = F.linear(hidden, weight, bias).float()  # (N, V): what the unfused step computes
    return F.cross_entropy(logits, target, ignore_index=PAD_ID, label_smoothing=smoothing, reduction="sum")


def fused_loss(chunks: int, compute_dtype: torch.dtype | None = None):
    return lambda hidden, weight, bias, target, smoothing: output_layer_loss(
        hidden, weight, bias=bias, target=target, label_smoothing=smoothing, compute_dtype=compute_dtype, chunks=chunks
    )


def value_and_grads(loss_fn, hidden, weight, bias, target, smoothing, tied_ids=None):
    """The loss and the gradients of hidden, weight and bias (None without bias) for 2.5 x the loss,
    plus, with `tied_ids`, a second use of the weight as an embedding (its gradient adds up)."""
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in (hidden, weight, bias)]
    loss = loss_fn(leaves[0], leaves[1], leaves[2], target, smoothing)
    total = 2.5 * loss  # a grad_output other than 1 must scale the gradients
    if tied_ids is not None:
        total = total + F.embedding(tied_ids, leaves[1]).float().pow(2).sum()
    total.backward()
    return loss.detach(), *(leaf.grad if leaf is not None else None for leaf in leaves)


def assert_close_to_scale(found: torch.Tensor, expected: torch.Tensor, relative: float, name: str) -> None:
    """max |found - expected| <= relative x max |expected|: summation order differs, so compare to the tensor's scale."""
    difference = (found.double() - expected.double()).abs().max().item()
    assert difference <= relative * expected.double().abs().max().item(), f"{name}: {difference}"


def noisy_multi30k(clean: int, noise: int, seed: int = 0) -> tuple[list[tuple[str, str]], dict[str, set[int]]]:
    """The first `clean` German-English Multi30k pairs with `noise` pairs of each kind of crawl noise mixed in at
    random places: shuffled (a target of another pair), copy (the source as its target), wrong_language (the
    French target), truncated (the target's first third); and where each kind went (indices into the pairs)."""
    sides = {lang: read_gz_lines(MULTI30K / f"train.{lang}.gz")[: clean + 4 * noise] for lang in ("de", "en", "fr")}
    rng = random.Random(seed)
    pairs = list(zip(sides["de"][:clean], sides["en"][:clean], strict=True))
    extra = range(clean, clean + 4 * noise)
    made = {
        "shuffled": [(sides["de"][i], sides["en"][rng.randrange(clean)]) for i in extra[:noise]],
        "copy": [(sides["de"][i], sides["de"][i]) for i in extra[noise : 2 * noise]],
        "wrong_language": [(sides["de"][i], sides["fr"][i]) for i in extra[2 * noise : 3 * noise]],
        "truncated": [(sides["de"][i], " ".join(words[: max(1, len(words) // 3)]))
                      for i in extra[3 * noise :] for words in [sides["en"][i].split()]],
    }  # fmt: skip
    labelled = [(pair, None) for pair in pairs] + [(pair, kind) for kind, made_pairs in made.items() for pair in made_pairs]
    rng.shuffle(labelled)
    where: dict[str, set[int]] = {kind: set() for kind in made}
    for index, (_, kind) in enumerate(labelled):
        if kind is not None:
            where[kind].add(index)
    return [pair for pair, _ in labelled], where


def read_gz_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]
