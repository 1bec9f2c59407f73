"""`train.compile_cache`: a compiled step's compiler artifacts kept between runs, in a file named by what decides the
compiled code; loaded before the first update where saved, a torn or stale file passed over with a line, written
atomically at the end. torch's own artifacts (what they hold, how much they save) are measured by the GPU check."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mtkit.config import load_config
from mtkit.training.compile_cache import CompileCache
from mtkit.training.levers import Levers

RECIPE = "recipes/multi30k/transformer.yaml"
CPU = torch.device("cpu")


def cache(tmp_path, *overrides: str) -> CompileCache | None:
    config = load_config(RECIPE, ["train.compile=true", f"train.compile_cache={tmp_path}", *overrides])
    return CompileCache.of(config, CPU, levers=Levers.of(config.train, CPU))


def test_the_file_is_named_by_the_model_the_levers_and_the_precision(tmp_path):
    path = cache(tmp_path).path
    assert path.parent == tmp_path and path.name.startswith("transformer-") and path.suffix == ".bin"
    assert cache(tmp_path, "train.lr=0.01").path == path  # the learning rate compiles the same code
    for other in ("model.d_model=128", "train.compile=layers", "train.precision=fp32", "train.label_smoothing=0.2"):
        assert cache(tmp_path, other).path != path, other


def test_no_cache_for_an_eager_step_or_when_off(tmp_path):
    assert cache(tmp_path, "train.compile=false") is None
    for off in ("off", "false"):  # YAML reads both as false
        config = load_config(RECIPE, ["train.compile=true", f"train.compile_cache={off}"])
        assert CompileCache.of(config, CPU, levers=Levers.of(config.train, CPU)) is None


def test_auto_keeps_it_under_mtkit_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(tmp_path))
    config = load_config(RECIPE, ["train.compile=true"])
    assert CompileCache.of(config, CPU, levers=Levers.of(config.train, CPU)).path.parent == tmp_path / "compile"


def test_saved_artifacts_are_written_whole_and_loaded_back(tmp_path, monkeypatch, capsys):
    target = cache(tmp_path / "new" / "folder")
    artifacts = bytes(range(256)) * 4
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (artifacts, SimpleNamespace(artifacts={})))
    target.save()
    assert target.path.read_bytes() == artifacts
    loaded = []
    info = SimpleNamespace(artifacts={"inductor": ["a", "b"], "autotune": ["c"]})
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: loaded.append(data) or info)
    target.load()
    assert loaded == [artifacts]
    assert "3 artifacts loaded from" in capsys.readouterr().err


def test_nothing_saved_is_nothing_written(tmp_path, monkeypatch):
    target = cache(tmp_path)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: None)
    target.save()
    assert not target.path.exists()


def test_a_file_torch_cannot_read_is_passed_over_with_a_line(tmp_path, monkeypatch, capsys):
    target = cache(tmp_path)
    target.path.write_bytes(b"torn")

    def refuse(data: bytes) -> None:
        raise RuntimeError("bad magic")

    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", refuse)
    target.load()  # no exception: the run compiles from scratch
    err = capsys.readouterr().err
    assert f"{target.path} not loaded (RuntimeError: bad magic); compiling from scratch" in err


def test_no_file_yet_says_where_it_will_be(tmp_path, capsys):
    target = cache(tmp_path)
    target.load()
    assert f"none yet at {target.path}" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(torch.compiler, "save_cache_artifacts"), reason="torch < 2.7 has no cache artifacts")
def test_this_torch_has_the_artifact_calls():
    assert callable(torch.compiler.load_cache_artifacts)
