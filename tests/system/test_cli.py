"""The installed `mtkit` command, run as a process, translates a line with the command-line tests' tiny run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_console_script_translates_one_line(cli_run):
    completed = subprocess.run(
        [sys.executable, "-m", "mtkit", "translate", "-m", str(cli_run)],
        input="Ein Hund läuft über die Wiese.\n".encode(),
        capture_output=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr.decode()
    assert completed.stdout.decode("utf-8").count("\n") == 1
    assert b"Traceback" not in completed.stderr
