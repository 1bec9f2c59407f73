"""Every script in benchmarks/ runs its --smoke mode as a user types it (`python -m benchmarks.NAME --smoke`, in a
process forked from one that has made its imports: tests/script_fork.py) and writes its JSON report: a new script
without a smoke mode fails here."""

from __future__ import annotations

import json
import os
import queue
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from pathlib import Path

import pytest
from script_fork import fork_server, run_module

REPO = Path(__file__).resolve().parents[2]
# modules the scripts import or run, not scripts
HELPERS = {"__init__", "common", "comet_build", "opennmt", "onmt_config", "peers_measure", "turns"}
SCRIPTS = sorted(path.stem for path in (REPO / "benchmarks").glob("*.py") if path.stem not in HELPERS)
# The top-level keys of each script's report (besides "smoke", which every one has in smoke mode).
KEYS = {
    "abuse": {"date", "model", "server_options", "machine", "matmul_gflop_per_s", "alone", "with_abusers", "throughput_kept"},
    "adaptation": {"date", "machine", "models"},
    "budget": {"date", "machine", "matmul_gflop_per_s", "rows"},
    "comet_speed": {"machine", "checkpoint", "sentences", "sentences_per_s", "system_scores", "ratio_mtkit_over_comet"},
    "decode_steps": {"date", "model", "machine", "sentences", "cap", "greedy", "beam5"},
    "decode_trees": {"date", "machine", "model", "sentences", "cap", "trees", "matmul_gflop_per_s", "turns",
                     "matmul_gflop_per_s_after", "ratios"},
    "distill": {"date", "machine", "matmul_gflop_per_s", "teacher", "students", "sentences", "rounds", "rows"},
    "multilingual": {"supervised", "zero_shot"},
    "nllb": {"date", "machine", "threads", "matmul_gflops", "versions", "model", "sentences", "batch", "cap", "repeats",
             "build", "beam5", "beam1", "update"},
    "ops": {"threads", "torch", "ops"},
    "optimizer": {"date", "machine", "torch", "recipe", "parameters_m", "matmul_gflop_per_s", "step_ms_rounds", "step_ms_best"},
    "opus_mt": {"date", "machine", "threads", "matmul_gflops", "model", "sentences", "cap", "repeats", "beam5_seconds",
                "beam1_seconds", "ct2_beam5_split_seconds", "update_seconds"},
    "packed": {"date", "model", "packed_layers", "sentences", "threads", "matmul_gflops_before", "beam5", "beam1",
               "matmul_gflops_after"},
    "paragraphs": {"date", "model", "machine", "device", "matmul_gflop_per_s", "captions", "paragraphs", "boundaries",
                   "boundaries_by_rules_alone", "sentence_ends", "bleu", "length_over_sentence_by_sentence",
                   "dropped", "speed", "matmul_gflop_per_s_after"},
    "peers": {"date", "recipe", "overrides", "machine", "counts", "not_matched", "matmul_gflop_per_s", "runs", "ratios",
              "onmt_commands"},
    "placeholders": {"date", "machine", "model", "test", "seed", "placeholders", "rows"},
    "rerank": {"date", "machine", "model", "test", "sentences", "candidates", "systems", "paired_tests"},
    "scale": {"machine", "cores", "prepare", "translate", "matmul_gflops"},
    "serve": {"model", "src", "server_options", "server_threads", "machine", "matmul_gflop_per_s", "offline", "serve", "ratio"},
    "sharded": {"date", "machine", "torch", "memory_gb", "batch_pairs", "length", "shapes"},
    "shortlist": {"date", "machine", "threads", "matmul_gflops", "cap", "repeats", "opus_mt", "nllb_600m", "bleu"},
    "speed": {"recipe", "machine", "decode", "train", "profile"},
    "import_memory": {"date", "machine", "shape", "safetensors_mb", "write_seconds", "import", "peak_over_file",
                      "growth_over_file"},
    "lora_memory": {"date", "machine", "versions", "batch_pairs", "length", "rank", "shapes"},
    "lora_quality": {"date", "machine", "parent", "children", "tests", "gain_kept"},
    "gpu_check": {"machine", "parts", "matmul_tflop_per_s", "speed", "profile", "parity", "compile", "big_compiled"},
    "transformers_export": {"date", "model", "form", "sentences", "max_log_prob_gap", "greedy_identical", "beam5_bleu",
                            "beam5_identical"},
    "terminology": {"date", "model", "machine", "device", "matmul_gflop_per_s", "ngrams", "glossary_entries", "glossary",
                    "matmul_gflop_per_s_after"},
    "tagged_set": {"date", "data", "seed", "aligner", "sentences", "tagged_sentences", "tags", "rows"},
    "tags": {"date", "model", "set", "machine", "beam", "sentences", "tags", "ways", "aligner", "forced_reference", "time",
             "bleu_gap_to_stripped"},
}  # fmt: skip


@dataclass(frozen=True)
class SmokeRun:
    """One script's smoke run: how it ended, what it printed, where its report is."""

    returncode: int | None
    stdout: str
    stderr: str
    report: Path


def run_smoke(name: str, folder: Path, cores: queue.Queue, server: ForkServerContext) -> SmokeRun:
    """`python -m benchmarks.NAME --smoke` on one core of `cores` (its threads and servers too: tiny models gain
    nothing from more, and threads that share cores with other processes wait for each other), forked from
    `server`, which imported torch and mtkit once (tests/script_fork.py)."""
    core = cores.get()
    report, stdout, stderr = (folder / f"{name}.{suffix}" for suffix in ("json", "out", "err"))
    arguments = ["--smoke", "--smoke-dir", str(folder), "--output", str(report)]
    process = server.Process(target=run_module, args=(f"benchmarks.{name}", arguments, REPO, core, stdout, stderr))
    try:
        process.start()
        process.join(timeout=180)
    finally:
        if process.exitcode is None:  # it ran out of time
            process.kill()
            process.join()
        cores.put(core)
    read = (path.read_text(encoding="utf-8", errors="replace") if path.is_file() else "" for path in (stdout, stderr))
    return SmokeRun(process.exitcode, *read, report)


@pytest.fixture(scope="module")
def smoke_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future]:
    """The smoke runs of the scripts this session selected, two at a time, one core each; the first that needs the
    tiny data and model builds them in the shared folder, and the others reuse them."""
    names = [
        item.callspec.params["name"]
        for item in request.session.items
        if item.path == request.path and getattr(item, "originalname", None) == "test_smoke_mode"
    ]
    folder = tmp_path_factory.mktemp("smoke")
    cores: queue.Queue = queue.Queue()
    for core in sorted(os.sched_getaffinity(0))[:2]:
        cores.put(core)
    pool = ThreadPoolExecutor(cores.qsize())
    request.addfinalizer(pool.shutdown)
    server = fork_server()
    return {name: pool.submit(run_smoke, name, folder, cores, server) for name in names}


def test_every_script_is_known() -> None:
    assert SCRIPTS == sorted(KEYS), "a script was added or removed: list its report's keys in KEYS"


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_smoke_mode(name: str, smoke_runs: dict[str, Future]) -> None:
    run = smoke_runs[name].result()
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.strip(), "prints its table"
    report = json.loads(run.report.read_text(encoding="utf-8"))
    assert report["smoke"] is True
    assert KEYS.get(name, set()) <= set(report)
    if name == "gpu_check":  # the first way of compiling is profiled from its warm cache
        assert "profile" in report["compile"]["by layer"]["warm"]
