"""The README's five-minute tour runs as written, in a shell, so the documentation cannot drift from the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tour_commands

REPO = Path(__file__).resolve().parents[2]


MULTI30K = REPO / "tests" / "corpus" / "multi30k"  # the tour reads 2,000 training pairs


@pytest.mark.slow
def test_the_five_minute_tour_runs_as_written(tmp_path: Path):
    commands = tour_commands((REPO / "README.md").read_text(encoding="utf-8"))
    work = tmp_path / "tour"
    # stop at the first failing command and name it
    script = "set -euo pipefail\ntrap 'echo \"tour command failed: $BASH_COMMAND\" >&2' ERR\n" + commands
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # the venv's mtkit
        "M": str(MULTI30K),
        "R": str(REPO / "recipes" / "multi30k" / "transformer.yaml"),
        "W": str(work),
    }
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{result.stderr[-4000:]}\n{result.stdout[-2000:]}"
    assert (work / "data" / "spm.model").is_file()
    assert (work / "run" / "best.pt").is_file()
    assert re.search(r"^BLEU\s+\d", result.stdout, flags=re.MULTILINE), result.stdout[-2000:]
    translation = [line for line in result.stdout.splitlines() if line and not line.startswith(("BLEU", "chrF", "TER"))]
    assert translation, "translate printed nothing"
