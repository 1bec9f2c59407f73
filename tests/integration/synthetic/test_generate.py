"""Synthetic corpora: a model writes one side of a training corpus at `mtkit prepare`, once, cached and resumable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import cli_said, torchrun_mtkit, write_reverse_task
from marian_builder import build_marian

from mtkit.config import load_config
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import load_tokenizers
from mtkit.decoding.translator import Decoding, Translator
from mtkit.errors import MtkitError
from mtkit.importers.marian import import_marian
from mtkit.synthetic.generate import CHUNK_LINES, synthesize
from mtkit.synthetic.jobs import plan_jobs

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def synthetic_recipe(root: Path, teacher: Path, pairs: int = 1_500, **changes: object) -> Path:
    """original pairs, the teacher's translations of the same sources, and tagged back-translations of the targets."""
    raw = root / "raw"
    if not raw.is_dir():
        write_reverse_task(raw, train_pairs=pairs, valid_pairs=20, seed=7)
    recipe = {
        "name": "student",
        "data_dir": str(root / "data"),
        "run_dir": str(root / "run"),
        "data": {
            "train": [
                {"src": str(raw / "train.src"), "tgt": str(raw / "train.tgt"), "name": "original", "limit": 300},
                {"src": str(raw / "train.src"), "translate_with": str(teacher), "name": "distilled", "decode": {"beam": 2}},
                {"tgt": str(raw / "train.tgt"), "back_translate_with": str(teacher), "name": "bt", "tag": "bt", "weight": 0.5},
            ],
            "valid": {"src": str(raw / "valid.src"), "tgt": str(raw / "valid.tgt")},
            "drop_copies": False,
            "dedup": False,
        },
        "tokenizer": {"vocab_size": 40},
        "model": {"layers": 1, "d_model": 32, "heads": 2, "ffn_dim": 64},
        "train": {"max_steps": 10, "validate_every": 10, "threads": 1},
    }
    for key, value in changes.items():
        section, name = key.split(".", 1) if "." in key else (key, None)
        if name is None:
            recipe[section] = value
        elif section == "distilled":
            recipe["data"]["train"][1][name] = value
        else:
            recipe[section][name] = value
    path = root / "student.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prepared(reverse_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    recipe = synthetic_recipe(root, reverse_run.run_path)
    said = cli_said("tokenizer", "train", recipe)
    cli_said("prepare", recipe)
    return root, recipe, said


def test_the_models_sides_are_their_translations_in_input_order_and_the_tag_goes_first(prepared, reverse_run):
    root, recipe, said = prepared
    assert "data.train[1]: its tgt is written by a model; the tokenizer learns from its src" in said
    jobs = plan_jobs(load_config(recipe))
    assert [job.done for job in jobs] == [True, True] and [job.side for job in jobs] == ["tgt", "src"]
    sources = (root / "raw" / "train.src").read_text(encoding="utf-8").splitlines()
    teacher = Translator.load([reverse_run.run_path])
    expected = [found[0].text for found in teacher.translate_nbest(sources, Decoding(beam=2))]
    assert jobs[0].output.read_text(encoding="utf-8").splitlines() == expected
    split = load_prepared(root / "data", "train")
    table = split.data.table if hasattr(split.data, "table") else split.data
    corpus, src_ids = table.column("corpus").to_pylist(), table.column("src_ids").to_pylist()
    bt = load_tokenizers(root / "data", True).src.control_id("<bt>")
    assert bt is not None and {ids[0] == bt for ids, c in zip(src_ids, corpus, strict=True) if c == 2} == {True}
    assert bt not in {ids[0] for ids, c in zip(src_ids, corpus, strict=True) if c != 2}
    cli_said("train", recipe)  # the tagged corpus trains like any other
    assert (root / "run" / "last.pt").is_file()


def test_two_processes_under_torchrun_write_the_same_corpora_as_one(prepared, reverse_run, tmp_path):
    root, recipe, _ = prepared
    alone = [job.output.read_text(encoding="utf-8") for job in plan_jobs(load_config(recipe))]
    shared = synthetic_recipe(tmp_path, reverse_run.run_path)  # the same pairs, a data folder of its own
    cli_said("tokenizer", "train", shared)
    two = subprocess.run(torchrun_mtkit(2, "prepare", shared), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-2000:]
    jobs = plan_jobs(load_config(shared))
    assert len(alone[0].splitlines()) > CHUNK_LINES  # both ranks translated a chunk of each corpus
    assert [job.output.read_text(encoding="utf-8") for job in jobs] == alone
    assert load_prepared(tmp_path / "data", "train")["tgt_ids"] == load_prepared(root / "data", "train")["tgt_ids"]


def test_a_second_prepare_reuses_the_cache_unless_the_model_input_or_decoding_changes(prepared, reverse_run, tmp_path):
    root, recipe, _ = prepared
    first = plan_jobs(load_config(recipe))
    stamps = [job.output.stat().st_mtime_ns for job in first]
    unrelated = synthetic_recipe(root, reverse_run.run_path, **{"train": {"max_steps": 99}})
    assert [job.folder for job in plan_jobs(load_config(unrelated))] == [job.folder for job in first]
    assert "is cached" in cli_said("prepare", unrelated)
    assert [job.output.stat().st_mtime_ns for job in first] == stamps
    other_beam = plan_jobs(load_config(synthetic_recipe(root, reverse_run.run_path, **{"distilled.decode": {"beam": 3}})))
    assert other_beam[0].folder != first[0].folder and other_beam[1].folder == first[1].folder
    copy = tmp_path / "teacher_copy"
    copy.mkdir()
    (copy / "best.pt").write_bytes((reverse_run.run_path / "best.pt").read_bytes() + b"")  # the same weights: the same key
    assert plan_jobs(load_config(synthetic_recipe(root, copy)))[0].folder == first[0].folder
    synthetic_recipe(root, reverse_run.run_path)  # leave the module's recipe as it was


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


def test_bad_synthetic_corpora_are_one_error_before_any_work(reverse_run, tmp_path):
    recipe = synthetic_recipe(tmp_path, reverse_run.run_path)
    missing = load_config(synthetic_recipe(tmp_path, tmp_path / "nowhere"))
    with pytest.raises(MtkitError, match=r"data.train\[1\].translate_with: .*nowhere does not exist"):
        synthesize(missing)
    (tmp_path / "empty.src").write_text("")
    empty = load_config(
        recipe, ["data.train=[{src: " + str(tmp_path / "empty.src") + ", translate_with: " + str(reverse_run.run_path) + "}]"]
    )
    with pytest.raises(MtkitError, match="empty.src: the file is empty"):
        synthesize(empty)
    build_marian(tmp_path / "marian")  # a model of en -> fr
    import_marian(str(tmp_path / "marian"), tmp_path / "en_fr")
    wrong = load_config(synthetic_recipe(tmp_path, tmp_path / "en_fr"), ["src_lang=de", "tgt_lang=en"])
    with pytest.raises(MtkitError, match=r"translate_with: .*en_fr translates en -> fr, but this corpus needs de -> en"):
        synthesize(wrong)
    assert not list((tmp_path / "data").glob("synthetic/*/chunks/*.txt"))  # nothing was translated
