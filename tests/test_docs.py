"""The README's five-minute tour runs as written, so the documentation cannot drift from the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MULTI30K = REPO / "tests" / "corpus" / "multi30k"  # the tour reads 2,000 training pairs
TOUR_HEADING = "## A five-minute tour"


def tour_commands(readme: str) -> str:
    """The first ```sh block after the tour's heading."""
    section = readme.split(TOUR_HEADING, 1)[1]
    block = re.search(r"^```sh\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert block, f"no ```sh block under {TOUR_HEADING!r} in README.md"
    return block.group(1)


def test_the_tour_block_covers_the_pipeline():
    commands = tour_commands((REPO / "README.md").read_text(encoding="utf-8"))
    for step in ("mtkit tokenizer train", "mtkit prepare", "mtkit train", "mtkit translate", "mtkit evaluate"):
        assert step in commands, f"the tour no longer runs {step!r}"


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


def test_the_developers_guide_lists_every_module_of_the_package():
    """docs/development.md's layout names every module under its package, so a newcomer finds each one."""
    guide = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    layout = guide.split("## Package layout", 1)[1].split("```")[1]
    missing = []
    for path in sorted((REPO / "mtkit").rglob("*.py")):
        relative = path.relative_to(REPO / "mtkit")
        names = [f"{part}/" for part in relative.parts[:-1]]
        if path.name != "__init__.py":  # a package's __init__ re-exports; the folder stands for it
            names.append(path.name)
        if not all(re.search(rf"^\s+{re.escape(name)}(\s|$)", layout, re.MULTILINE) for name in names):
            missing.append(str(relative))
    assert not missing, f"docs/development.md's layout leaves out {missing}"
