"""An export's output folder (mtkit.exporters.folder): a kill at any step of `--force`'s swap leaves the earlier export
or the new one whole (at -o, or set aside where the system cannot swap in one step), the next export removes what a
killed one left and says so, and what changed in -o since the check is never replaced silently.

A kill is simulated in the process: at the step, the folder holding -o is copied as it stands (what a SIGKILL
would leave: no cleanup runs) and the export is stopped; the checks then read the copy.
(tests/system/exporters/test_killed_export.py kills a real export with SIGKILL.)"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import mtkit.exporters.folder as folder
from mtkit.decoding.ct2_engine import MANIFEST
from mtkit.errors import MtkitError
from mtkit.exporters.folder import check_output_dir, staged

FILES = (MANIFEST, "model.bin", "source.spm")


class Killed(BaseException):
    """The process ended at this step (no except or finally of the export runs on the copy)."""


def write_export(target: Path, version: str) -> None:
    for name in FILES:
        (target / name).write_text(json.dumps({"version": version, "file": name}) + version * 100, encoding="utf-8")


def export(out: Path, version: str, *, force: bool = True) -> None:
    """What every exporter does: check -o, write into the staging folder, swap it in."""
    held = check_output_dir(out, force=force)
    with staged(out, held=held) as staging:
        write_export(staging, version)


def version_of(target: Path) -> str:
    """The version a folder holds whole (every file, all of one export), else a failure naming what is wrong."""
    versions = {json.loads((target / name).read_text(encoding="utf-8").split("}")[0] + "}")["version"] for name in FILES}
    assert len(versions) == 1 and sorted(os.listdir(target)) == sorted(FILES), (target, versions, os.listdir(target))
    return versions.pop()


def beside(out: Path) -> list[str]:
    return sorted(name for name in os.listdir(out.parent) if name.startswith(f".{out.name}."))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """-o (`site/exp`) holding an earlier export, v1."""
    out = tmp_path / "site" / "exp"
    export(out, "v1")
    return out


def killer(site: Path) -> Callable[[], None]:
    """Stops the export here, keeping what the folder holds at this instant in `site.parent.parent / "image"`."""

    def kill() -> None:
        shutil.copytree(site.parent, site.parent.parent / "image", symlinks=True)
        raise Killed

    return kill


def kill_while_writing(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kill = killer(site)

    def partly(target: Path, version: str) -> None:
        (target / FILES[0]).write_text(version, encoding="utf-8")
        kill()

    monkeypatch.setitem(globals(), "write_export", partly)


def kill_before_the_swap(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kill = killer(site)
    monkeypatch.setattr(folder, "check_unchanged", lambda *_: kill())


def kill_after_the_exchange(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kill, exchange = killer(site), folder.exchange
    monkeypatch.setattr(folder, "exchange", lambda *paths: exchange(*paths) and kill())


def kill_while_deleting_the_earlier(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kill, rmtree = killer(site), shutil.rmtree

    def deleting(path: Path, **options: object) -> None:
        if Path(path).is_dir() and (Path(path) / "model.bin").is_file():
            (Path(path) / "model.bin").unlink()  # part of it is gone ...
            kill()  # ... when the process dies
        rmtree(path, **options)

    monkeypatch.setattr(shutil, "rmtree", deleting)


def two_steps(kill_after: str) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """Without renameat2's exchange: killed after the earlier export is set aside, or after the new one is in."""

    def arrange(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        kill, rename = killer(site), Path.rename

        def renaming(self: Path, target: Path) -> Path:
            moved = rename(self, target)
            if Path(target).name.startswith(f".{site.name}.old.") == (kill_after == "aside"):
                kill()
            return moved

        monkeypatch.setattr(folder, "exchange", lambda *_: False)
        monkeypatch.setattr(Path, "rename", renaming)

    return arrange


KILLS = {
    "writing": (kill_while_writing, "v1"),
    "before-the-swap": (kill_before_the_swap, "v1"),
    "after-exchange": (kill_after_the_exchange, "v2"),
    "deleting-the-earlier": (kill_while_deleting_the_earlier, "v2"),
    "two-steps-set-aside": (two_steps("aside"), None),
    "two-steps-swapped-in": (two_steps("in"), "v2"),
}


@pytest.mark.parametrize("step", KILLS)
def test_a_kill_at_any_step_leaves_one_export_whole_and_the_next_export_removes_the_rest(site, monkeypatch, capsys, step):
    arrange, at_output = KILLS[step]
    with monkeypatch.context() as patched:
        arrange(site, patched)
        with pytest.raises(Killed):
            export(site, "v2")
    image = site.parent.parent / "image" / site.name
    if at_output is None:  # the one instant without renameat2: the earlier export is whole, set aside
        assert not image.exists()
        (aside,) = [name for name in beside(image) if name.startswith(".exp.old.")]
        assert version_of(image.parent / aside) == "v1"
    else:
        assert version_of(image) == at_output
    left = beside(image)
    capsys.readouterr()
    export(image, "v3")
    assert version_of(image) == "v3" and beside(image) == []
    said = capsys.readouterr().err
    assert all(f"removed {image.parent / name}, left by an export to {image} that was stopped" in said for name in left)


def test_the_swap_exchanges_in_one_step_where_the_system_allows(site, monkeypatch):
    seen = []
    exchange = folder.exchange

    def watched(*paths: Path) -> bool:
        seen.append(version_of(site))
        done = exchange(*paths)
        seen.append(version_of(site))
        return done

    monkeypatch.setattr(folder, "exchange", watched)
    export(site, "v2")
    assert seen == ["v1", "v2"] and version_of(site) == "v2" and beside(site) == []


def test_files_put_in_the_output_while_exporting_are_never_replaced(site):
    with pytest.raises(MtkitError) as refused, staged(site, held=check_output_dir(site, force=True)) as staging:
        write_export(staging, "v2")
        (site / "notes.txt").write_text("mine", encoding="utf-8")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{site}: notes.txt appeared there while exporting")
    assert (site / "notes.txt").read_text(encoding="utf-8") == "mine" and beside(site) == []
    (site / "notes.txt").unlink()
    assert version_of(site) == "v1"


def test_an_output_that_was_empty_and_filled_meanwhile_is_refused(tmp_path):
    out = tmp_path / "exp"
    with pytest.raises(MtkitError, match="another.yaml appeared there while exporting"):
        with staged(out, held=check_output_dir(out, force=False)) as staging:
            write_export(staging, "v1")
            out.mkdir()
            (out / "another.yaml").write_text("x", encoding="utf-8")
    assert os.listdir(out) == ["another.yaml"] and beside(out) == []


@pytest.mark.parametrize("when", ["before", "while"])
def test_a_symlinked_output_is_one_line(tmp_path, when):
    real = tmp_path / "real"
    export(real, "v1")
    link = tmp_path / "exp"
    if when == "before":
        link.symlink_to(real)
        with pytest.raises(MtkitError, match=rf"^{link}: is a symbolic link \(to {real}\); give the folder itself as -o"):
            export(link, "v2")
    else:
        with pytest.raises(MtkitError, match="is a symbolic link"):
            with staged(link, held=check_output_dir(link, force=True)) as staging:
                write_export(staging, "v2")
                link.symlink_to(real)
    assert link.is_symlink() and version_of(real) == "v1" and beside(link) == []


def test_only_mtkits_own_leftovers_that_no_running_export_holds_are_removed(site, capsys):
    made = {}
    for name, marker in [
        (".exp.staging.abcd1234", False),  # a killed export's staging folder: removed
        (".exp.old.efgh5678", True),  # an earlier export set aside: removed
        (".exp.q1w2e3r4", True),  # a finished export under the staging name of mtkit before these: removed
        (".exp.zxcv0987", False),  # that name without an export in it: not mtkit's, left
        (".exp.staging.held0000", False),  # a running export's: left
        (".exp.notes", False),  # not mtkit's name: left
        (".other.staging.abcd1234", False),  # another output's: left
    ]:
        made[name] = site.parent / name
        made[name].mkdir()
        if marker:
            write_export(made[name], "v0")
    (site.parent / ".exp.staging.link0000").symlink_to(made[".exp.zxcv0987"])  # a link: left, and its target too
    held = os.open(made[".exp.staging.held0000"], os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        export(site, "v2")
    finally:
        os.close(held)
    kept = [".exp.notes", ".exp.staging.held0000", ".exp.staging.link0000", ".exp.zxcv0987"]
    assert beside(site) == kept and (site.parent / ".other.staging.abcd1234").is_dir()
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 3 and all(line.startswith("mtkit: removed ") for line in said)


@pytest.mark.parametrize("given", [".", "..", "sub/.."])
def test_an_output_without_a_name_is_one_line(tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MtkitError, match=r"give the export's folder by its name"):
        export(Path(given), "v1")
