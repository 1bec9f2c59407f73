"""`mtkit import` of a hub id, offline (huggingface_hub's model_info and snapshot_download replaced by stand-ins):
--revision reaches the download, every download of one import is pinned to the commit it resolves to, which
best.pt records; sharded weights are refused from the repository's file list, before anything is downloaded."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import huggingface_hub
import pytest
from helpers import assert_one_line_error, cli_output, invoke
from marian_builder import Variant, build_marian

from mtkit.errors import MtkitError
from mtkit.importers import import_model
from mtkit.models.checkpoint import read_checkpoint

pytestmark = [
    pytest.mark.usefixtures("transformers_installed"),  # shared_fixtures.py
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "Helsinki-NLP/opus-mt-en-fr"


@pytest.fixture(scope="module")
def marian_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("marian") / "model"
    build_marian(folder, Variant())
    return folder


class Hub:
    """The hub, offline: a repository whose files are `files`, at COMMIT whatever revision is asked for; it records
    what each call asked."""

    def __init__(self, folder: Path, cache: Path, files: list[str]) -> None:
        self.folder, self.cache, self.files = folder, cache, files
        self.listed: list[str | None] = []
        self.downloads: list[tuple[str | None, list[str]]] = []

    def model_info(self, repo_id: str, revision: str | None = None) -> types.SimpleNamespace:
        self.listed.append(revision)
        siblings = [types.SimpleNamespace(rfilename=name) for name in self.files]
        return types.SimpleNamespace(sha=COMMIT, siblings=siblings)

    def snapshot_download(self, repo_id: str, revision: str | None = None, allow_patterns: list[str] | None = None) -> str:
        self.downloads.append((revision, allow_patterns or []))
        snapshot = self.cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / COMMIT
        if not snapshot.exists():
            shutil.copytree(self.folder, snapshot)
        return str(snapshot)


@pytest.fixture
def hub(marian_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Hub:
    files = sorted(path.name for path in marian_folder.iterdir())
    stand_in = Hub(marian_folder, tmp_path / "cache", files)
    monkeypatch.setattr(huggingface_hub, "model_info", stand_in.model_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", stand_in.snapshot_download)
    return stand_in


def test_revision_reaches_the_download_and_best_pt_records_the_commit(hub: Hub, tmp_path: Path) -> None:
    said = cli_output("import", "auto", REPO, "-o", tmp_path / "run", "--revision", "v1.0")
    assert "imported" in said
    # config.json at the revision asked for, then the family's files at the commit it resolved to
    assert [revision for revision, _ in hub.downloads] == ["v1.0", COMMIT] and hub.listed == [COMMIT]
    assert hub.downloads[0][1] == ["config.json"] and "*.safetensors" in hub.downloads[1][1]
    payload = read_checkpoint(tmp_path / "run" / "best.pt")
    assert payload["imported_from"] == REPO and payload["imported_commit"] == COMMIT


def test_without_a_revision_the_newest_is_downloaded_and_its_commit_recorded(hub: Hub, tmp_path: Path) -> None:
    import_model(REPO, tmp_path / "run", family="marian")
    assert hub.listed == [None] and [revision for revision, _ in hub.downloads] == [COMMIT]
    assert read_checkpoint(tmp_path / "run" / "best.pt")["imported_commit"] == COMMIT


def test_sharded_weights_are_refused_before_anything_is_downloaded(hub: Hub, tmp_path: Path) -> None:
    hub.files = [name for name in hub.files if name != "model.safetensors"]
    hub.files += ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    result = invoke("import", "marian", REPO, "-o", tmp_path / "run")
    assert_one_line_error(result, REPO, "sharded weights are not supported", "model.safetensors.index.json")
    assert hub.downloads == [] and not (tmp_path / "run").exists()


def test_a_revision_for_a_local_folder_is_one_line(marian_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(MtkitError, match="--revision main: only for a hub id;") as raised:
        import_model(str(marian_folder), tmp_path / "run", revision="main")
    assert "\n" not in str(raised.value) and not (tmp_path / "run").exists()


def test_a_local_import_records_no_commit(marian_folder: Path, tmp_path: Path) -> None:
    import_model(str(marian_folder), tmp_path / "run")
    payload = read_checkpoint(tmp_path / "run" / "best.pt")
    assert payload["imported_from"] == str(marian_folder) and payload["imported_commit"] is None
