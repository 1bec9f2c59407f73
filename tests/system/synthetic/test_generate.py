"""Synthetic corpora across processes: two processes under torchrun write what one writes, and a killed
generation keeps its finished chunks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import cli_said, synthetic_recipe, torchrun_mtkit

from mtkit.config import load_config
from mtkit.data.store import load_prepared
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.synthetic.generate import CHUNK_LINES
from mtkit.synthetic.jobs import plan_jobs

REPO = Path(__file__).resolve().parents[3]


def test_two_processes_under_torchrun_write_the_same_corpora_as_one(synthetic_prepared, reverse_run, tmp_path):
    root, recipe, _ = synthetic_prepared
    alone = [job.output.read_text(encoding="utf-8") for job in plan_jobs(load_config(recipe))]
    shared = synthetic_recipe(tmp_path, reverse_run.run_path)  # the same pairs, a data folder of its own
    cli_said("tokenizer", "train", shared)
    two = subprocess.run(torchrun_mtkit(2, "prepare", shared), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-2000:]
    jobs = plan_jobs(load_config(shared))
    assert len(alone[0].splitlines()) > CHUNK_LINES  # both ranks translated a chunk of each corpus
    assert [job.output.read_text(encoding="utf-8") for job in jobs] == alone
    assert load_prepared(tmp_path / "data", "train")["tgt_ids"] == load_prepared(root / "data", "train")["tgt_ids"]


def test_killing_generation_then_preparing_again_keeps_the_finished_chunks(reverse_run, tmp_path):
    recipe = synthetic_recipe(tmp_path, reverse_run.run_path, pairs=5 * CHUNK_LINES)
    cli_said("tokenizer", "train", recipe)
    command = [sys.executable, "-m", "mtkit", "prepare", str(recipe)]
    job = plan_jobs(load_config(recipe))[0]
    first = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    deadline = time.monotonic() + 120
    while len(list(job.chunks.glob("*.txt"))) < 2 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    kept = {path.name: path.stat().st_mtime_ns for path in job.chunks.glob("*.txt")}
    assert 2 <= len(kept) < 5 and not job.done
    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert second.returncode == 0, second.stderr[-2000:]
    progress = [line for line in second.stderr.splitlines() if line.startswith("distilled: ")]
    assert progress[0].startswith(f"distilled: {(len(kept) + 1) * CHUNK_LINES:,}/"), progress  # the finished chunks were kept
    sources = (tmp_path / "raw" / "train.src").read_text(encoding="utf-8").splitlines()
    expected = [found[0].text for found in Translator.load([reverse_run.run_path]).translate_nbest(sources, Decoding(beam=2))]
    assert job.output.read_text(encoding="utf-8").splitlines() == expected
