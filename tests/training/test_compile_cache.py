"""`train.compile_cache`: a compiled step's compiler artifacts kept between runs, in a file named by what decides the
compiled code; loaded before the first update where saved, a torn or stale file passed over with a line, written
atomically at the end. torch's own artifacts (what they hold, how much they save) are measured by the GPU check."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest
import torch

from mtkit.config import load_config
from mtkit.errors import MtkitError
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


# The cache is code torch runs: refused where another user can write it


def fake_artifacts(monkeypatch) -> list[bytes]:
    """save_cache_artifacts gives some bytes; load_cache_artifacts records what it was handed."""
    loaded: list[bytes] = []
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"kernels", SimpleNamespace(artifacts={})))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: loaded.append(data) or SimpleNamespace(artifacts={}))
    return loaded


@pytest.mark.parametrize("shared", ["folder", "file"])
def test_a_cache_folder_or_file_that_other_users_can_write_is_refused(tmp_path, monkeypatch, shared):
    loaded = fake_artifacts(monkeypatch)
    target = cache(tmp_path / "cache")
    target.save()
    unsafe = target.path.parent if shared == "folder" else target.path
    for mode in (0o775, 0o757) if shared == "folder" else (0o664, 0o646):
        unsafe.chmod(mode)
        with pytest.raises(MtkitError) as error:
            target.load()
        message = str(error.value)
        assert message.startswith(f"{unsafe}: the compiler cache is code that torch runs, and other users can write it")
        assert f"mode 0{mode:o}" in message and f"chmod go-w {unsafe}" in message and "\n" not in message
    assert loaded == []
    unsafe.chmod(0o755 if shared == "folder" else 0o644)
    target.load()
    assert loaded == [b"kernels"]


def test_a_cache_file_of_another_user_is_refused(tmp_path, monkeypatch):
    fake_artifacts(monkeypatch)
    target = cache(tmp_path)
    target.save()
    if os.geteuid() == 0:
        os.chown(target.path, 4242, -1)
    else:  # this user's files are another's to a process that believes it is someone else
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    with pytest.raises(MtkitError, match=r"belongs to another user .*set train.compile_cache to a folder of your own"):
        target.load()


def test_the_cache_is_written_writable_by_its_owner_alone_whatever_the_umask(tmp_path, monkeypatch):
    fake_artifacts(monkeypatch)
    target = cache(tmp_path / "new")
    previous = os.umask(0o002)  # a user-private-group umask: new files group-writable
    try:
        target.save()
    finally:
        os.umask(previous)
    assert stat.S_IMODE(target.path.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE(target.path.stat().st_mode) == 0o644
    target.load()  # and the next run takes it


def test_a_shared_cache_folder_is_refused_before_the_run_writes_anything(tmp_path):
    from helpers import prepared_reverse_task

    from mtkit.training.trainer import train

    shared = tmp_path / "shared-cache"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    config = prepared_reverse_task(tmp_path, max_steps=1, compile="true", compile_cache=str(shared))
    with pytest.raises(MtkitError, match=f"{shared}: the compiler cache is code"):
        train(config)
    assert not config.run_path.exists()
