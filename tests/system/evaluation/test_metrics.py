"""Importing the metrics module (in a fresh process) does not load sacrebleu."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_import_does_not_load_sacrebleu():
    code = "import sys, mtkit.evaluation.metrics; print('sacrebleu' in sys.modules)"
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"
