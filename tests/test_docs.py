"""The README's five-minute tour runs as written, so the documentation cannot drift from the CLI."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import tour_commands

REPO = Path(__file__).resolve().parents[1]


def test_the_tour_block_covers_the_pipeline():
    commands = tour_commands((REPO / "README.md").read_text(encoding="utf-8"))
    for step in ("mtkit tokenizer train", "mtkit prepare", "mtkit train", "mtkit translate", "mtkit evaluate"):
        assert step in commands, f"the tour no longer runs {step!r}"


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
