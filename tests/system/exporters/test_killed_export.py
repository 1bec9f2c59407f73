"""`mtkit export --force` killed (SIGKILL, in a child process) while it deletes the earlier export, as the security
review reproduced it: the export at -o stays whole and translates, and the next export removes what was left."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from marian_builder import build_marian

from mtkit.decoding.ct2_engine import load_export
from mtkit.decoding.translator import Translator
from mtkit.exporters import export_model
from mtkit.importers.marian import import_marian
from mtkit.options import ExportFormat

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")

LINES = ["a man is walking .", "two dogs play in the snow ."]
KILLED_WHILE_DELETING = """
import os, shutil, signal, sys
from pathlib import Path
from mtkit.exporters import export_model
from mtkit.options import ExportFormat
real = shutil.rmtree
def killed_midway(path, *args, **kwargs):
    if (Path(path) / "model.bin").is_file():  # the earlier export, wherever it is deleted from
        (Path(path) / "model.bin").unlink()  # part of it is gone ...
        os.kill(os.getpid(), signal.SIGKILL)  # ... when the process dies
    return real(path, *args, **kwargs)
shutil.rmtree = killed_midway
export_model(Path(sys.argv[1]), Path(sys.argv[2]), export_format=ExportFormat.CTRANSLATE2, force=True)
"""


def test_an_export_killed_while_replacing_the_earlier_one_leaves_a_whole_export(tmp_path, capsys):
    build_marian(tmp_path / "marian")
    import_marian(str(tmp_path / "marian"), tmp_path / "run")
    out = tmp_path / "site" / "exp"
    export_model(tmp_path / "run", out, export_format=ExportFormat.CTRANSLATE2)
    expected = Translator.over(load_export(out, threads=1)).translate(LINES)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_DELETING, str(tmp_path / "run"), str(out)], capture_output=True, text=True
    )
    assert killed.returncode == -9, killed.stderr
    assert Translator.over(load_export(out, threads=1)).translate(LINES) == expected
    left = sorted(os.listdir(out.parent))
    assert left[0].startswith(".exp.staging.") and left[1:] == ["exp"]  # the earlier export, part deleted
    capsys.readouterr()
    export_model(tmp_path / "run", out, export_format=ExportFormat.CTRANSLATE2, force=True)
    assert sorted(os.listdir(out.parent)) == ["exp"]
    assert f"mtkit: removed {out.parent / left[0]}, left by an export to {out}" in capsys.readouterr().err
    assert Translator.over(load_export(out, threads=1)).translate(LINES) == expected
