"""What the benchmarks share: mtkit commands as a user types them, the fp32 matmul peak, JSON reports,
a server to load, and the tiny data and model of every script's `--smoke` mode."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import gzip
import http.client
import io
import itertools
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import torch
import yaml

from mtkit.config import load_config
from mtkit.errors import MtkitError
from mtkit.textio import write_file

ROOT = Path(__file__).resolve().parent.parent
SMOKE_SOURCE = ROOT / "tests" / "corpus" / "multi30k"  # the tests' own slice: a clone alone runs every smoke mode
SMOKE_LANGUAGES = ("de", "en", "fr")
SMOKE_LINES = {"train": 1000, "val": 10, "test_2016_flickr": 10}
# A model that trains in well under a second on one thread: the smoke mode's figures mean nothing.
SMOKE_MODEL = ["model.layers=1", "model.d_model=32", "model.heads=2", "model.ffn_dim=64", "model.dropout=0.0"]
SMOKE_TRAIN = [
    "train.batch_tokens=1000",
    "train.max_steps=20",
    "train.max_time=null",
    "train.validate_every=20",
    "train.log_every=10",
    "train.lr=0.003",
    "train.warmup_steps=10",
    "train.threads=1",
]
SMOKE_DECODE = ["decode.beam=2", "decode.max_len_a=1.0", "decode.max_len_b=5"]


def transformers_shape(shape: dict) -> dict[str, int]:
    """A benchmark's model shape (d_model, layers a side, heads, ffn) as a transformers encoder-decoder config's
    keyword arguments (MarianConfig, M2M100Config)."""
    sides = {f"{side}_{key}": shape[name] for side in ("encoder", "decoder") for key, name in
             (("layers", "layers"), ("attention_heads", "heads"), ("ffn_dim", "ffn"))}  # fmt: skip
    return {"d_model": shape["d_model"], **sides}


def set_args(overrides: Sequence[str]) -> list[str]:
    """Recipe overrides as the command line takes them: --set KEY=VALUE for each."""
    return [part for override in overrides for part in ("--set", override)]


@dataclass(frozen=True)
class MtkitCommands:
    """mtkit commands as a user types them, each shown on stderr first; their standard output is returned.

    Each runs in a subprocess of this interpreter, or, with `in_process` (smoke mode, where starting
    a process would cost more than the work), in this process through the same command line.
    """

    in_process: bool = False

    def run(self, arguments: Sequence[object]) -> str:
        words = [str(argument) for argument in arguments]
        print("$ " + shlex.join(["mtkit", *words]), file=sys.stderr, flush=True)
        status, output = self._here(words) if self.in_process else self._subprocess(words)
        if status:
            raise MtkitError(f"`mtkit {shlex.join(words)}` failed (exit status {status}); see its output above")
        return output

    @staticmethod
    def _subprocess(words: list[str]) -> tuple[int, str]:
        done = subprocess.run([sys.executable, "-m", "mtkit", *words], stdout=subprocess.PIPE, text=True, check=False)
        return done.returncode, done.stdout

    @staticmethod
    def _here(words: list[str]) -> tuple[int, str]:
        from mtkit.cli import app

        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            status = app(words, prog_name="mtkit", standalone_mode=False)
        return status or 0, output.getvalue()


def ensure_prepared(commands: MtkitCommands, recipe: Path, overrides: list[str]) -> None:
    """`mtkit tokenizer train` and `mtkit prepare` for the recipe, where its data directory lacks their output."""
    from mtkit.data.store import REPORT_FILE
    from mtkit.data.tokenizer import tokenizer_files

    config = load_config(recipe, overrides)
    data = config.data_path
    tokenizer_missing = not all(path.is_file() for path in tokenizer_files(data, joint=config.tokenizer.joint))
    if tokenizer_missing:
        print(f"{data}: no tokenizer model yet; training it, then preparing the data", file=sys.stderr)
        print(commands.run(["tokenizer", "train", recipe, *set_args(overrides)]), file=sys.stderr, end="")
    if tokenizer_missing or not (data / REPORT_FILE).is_file():
        print(f"{data}: preparing the recipe's data", file=sys.stderr)
        print(commands.run(["prepare", recipe, *set_args(overrides)]), file=sys.stderr, end="")
    else:
        print(f"{data}: tokenizer model and prepared data found", file=sys.stderr)


def write_json(path: Path, report: dict, indent: int = 1) -> None:
    """Write a report as JSON (its folder made first), through mtkit's atomic writer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(report, indent=indent) + "\n")


def machine_facts() -> dict:
    """The torch threads and the torch and Python versions, as most reports give them."""
    return {"cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version()}


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work, so that a clock read after it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops_per_s(
    device: torch.device = torch.device("cpu"), dtype: torch.dtype | None = None, *, smoke: bool = False
) -> float:
    """Best-of-3 FLOP/s of a square matrix multiply: fp32 with torch's threads on CPU, `dtype` on CUDA.

    `smoke`: a small matrix, a figure that means nothing but costs nothing.
    """
    size, repeats = (128, 2) if smoke else (8192, 10) if device.type == "cuda" else (1024, 20)
    a = torch.randn(size, size, device=device, dtype=dtype or torch.float32)
    b = torch.randn(size, size, device=device, dtype=dtype or torch.float32)
    for _ in range(3):
        a @ b  # warm-up
    best = float("inf")
    for _ in range(3):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 * repeats / best


def matmul_gflop_per_s(*, smoke: bool = False) -> float:
    """The CPU's fp32 matmul peak in GFLOP/s, to one decimal."""
    return round(matmul_flops_per_s(smoke=smoke) / 1e9, 1)


def first_lines(path: Path, count: int) -> list[str]:
    """The first `count` lines of a gzipped text file, stripped."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.strip() for line in itertools.islice(handle, count)]


def free_port() -> int:
    """A loopback port free at this moment."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model: Path, port: int, options: list[str], threads: int, log: IO[str]) -> subprocess.Popen:
    """`mtkit serve` in a subprocess (`threads` > 0: its torch threads), returned once /health answers 200."""
    command = [sys.executable, "-m", "mtkit", "serve", "-m", str(model), "--port", str(port), "--device", "cpu", *options]
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    process = subprocess.Popen(command, stdout=log, stderr=log, env=environment)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise MtkitError(f"the server exited with status {process.returncode}: {log.read().strip()[-500:]}")
        if healthy(port):
            return process
        time.sleep(0.2)
    process.kill()
    raise MtkitError("the server did not answer /health within 180 s")


def healthy(port: int) -> bool:
    """Whether the server on `port` answers /health with 200."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        return send(connection, "GET", "/health")[0] == 200
    except OSError:
        return False
    finally:
        connection.close()


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM, as a service manager stops it; killed if it has not ended within a minute."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def send(connection: http.client.HTTPConnection, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """One request on a keep-alive connection: (status, JSON body)."""
    data = json.dumps(body).encode() if body is not None else None
    connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    raw = response.read()
    return response.status, json.loads(raw) if raw else {}


def add_smoke_options(parser: argparse.ArgumentParser) -> None:
    """--smoke and --smoke-dir, the same in every benchmark."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="run the whole benchmark in seconds on a tiny model and data (tests/corpus/), offline; its figures mean "
        'nothing and the JSON says "smoke": true',
    )
    parser.add_argument(
        "--smoke-dir",
        type=Path,
        help="with --smoke: keep the tiny data and model here and reuse them (default: a temporary folder)",
    )


def parsed_with_model(parser: argparse.ArgumentParser, *, flag: str = "--model") -> argparse.Namespace:
    """The arguments of a benchmark that measures a trained run: --smoke's options added, and the model (`flag`)
    required but with --smoke, which brings its own tiny one."""
    add_smoke_options(parser)
    args = parser.parse_args()
    if args.model is None and not args.smoke:
        parser.error(f"the following arguments are required: {flag}")
    return args


def smoke_label(args: argparse.Namespace) -> dict:
    """{"smoke": true} at the head of a smoke run's report; nothing otherwise."""
    return {"smoke": True} if args.smoke else {}


@contextlib.contextmanager
def smoke_mode(args: argparse.Namespace, tiny: Callable[[argparse.Namespace, Path], None]) -> Iterator[None]:
    """With --smoke: `tiny(args, work)` sets the tiny arguments, its data and model kept in `work` (--smoke-dir,
    else a temporary folder, removed at the end); without, nothing."""
    if not args.smoke:
        yield
    elif args.smoke_dir is not None:
        args.smoke_dir.mkdir(parents=True, exist_ok=True)
        tiny(args, args.smoke_dir.resolve())
        yield
    else:
        with tempfile.TemporaryDirectory(prefix="mtkit-smoke-") as scratch:
            tiny(args, Path(scratch))
            yield


def measure_and_write(
    args: argparse.Namespace,
    tiny: Callable[[argparse.Namespace, Path], None],
    measure: Callable[[argparse.Namespace], dict],
    output: Path,
    indent: int = 1,
) -> dict:
    """`measure(args)` (in smoke mode with --smoke, `tiny` setting its arguments), its report written to `output`
    as JSON; an MtkitError ends the process with one line that names the script."""
    try:
        with smoke_mode(args, tiny):
            report = measure(args)
    except MtkitError as err:
        sys.exit(f"{Path(sys.argv[0]).stem}: error: {err}")
    write_json(output, report, indent)
    if args.smoke:  # the interpreter's last collections over torch's objects would take longer than the run's work
        gc.freeze()
    return report


def smoke_corpus(work: Path) -> Path:
    """work/multi30k: the first lines of the tests' Multi30k slice (German, English, French), as the files of
    ../shared/data/multi30k are named; written once."""
    folder = work / "multi30k"
    for (split, count), lang in itertools.product(SMOKE_LINES.items(), SMOKE_LANGUAGES):
        path = folder / f"{split}.{lang}.gz"
        if not path.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            text = "".join(line + "\n" for line in first_lines(SMOKE_SOURCE / path.name, count))
            write_file(path, gzip.compress(text.encode("utf-8"), mtime=0))
    return folder


def smoke_recipe(work: Path) -> Path:
    """work/smoke.yaml: a tiny German -> English recipe over `smoke_corpus`, prepared and trained into work/smoke_run
    the first time (in this process; a smoke run beside it that wants the same waits for it)."""
    recipe, run = work / "smoke.yaml", work / "smoke_run"
    with open(work / "smoke.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (run / "trained").is_file():
            write_file(recipe, yaml.safe_dump(smoke_settings(work, run), sort_keys=False))
            commands = MtkitCommands(in_process=True)
            for command in (["tokenizer", "train"], ["prepare"], ["train", "--overwrite"]):
                commands.run([*command, recipe])
            write_file(run / "trained", "")
    return recipe


def smoke_settings(work: Path, run: Path) -> dict:
    """The tiny recipe: `smoke_corpus` German -> English, the SMOKE_* settings, its data and run in `work`."""
    corpus = smoke_corpus(work)
    splits = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
    settings = {
        "name": "smoke",
        "src_lang": "de",
        "tgt_lang": "en",
        "data_dir": str(work / "smoke_data"),
        "run_dir": str(run),
        "data": {key: {"src": f"{corpus}/{name}.de.gz", "tgt": f"{corpus}/{name}.en.gz"} for key, name in splits.items()},
    }
    for override in ["tokenizer.vocab_size=300", *SMOKE_MODEL, *SMOKE_TRAIN, *SMOKE_DECODE]:
        key, _, value = override.partition("=")
        section, name = key.split(".")
        settings.setdefault(section, {})[name] = yaml.safe_load(value)
    return settings


def smoke_run(work: Path) -> Path:
    """The run directory of `smoke_recipe`'s tiny model (trained the first time)."""
    smoke_recipe(work)
    return work / "smoke_run"
