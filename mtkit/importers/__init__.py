"""Importers: models trained elsewhere turned into ordinary mtkit run directories.

One module per foreign family (marian.py, m2m100.py, mbart.py; fairseq.py what the last two share) over
the shared loader (loader.py): the family's
`Family` says how config.json names it and reads its folder directly (no foreign library at run
time), refusing what mtkit cannot represent with one line naming the key; the loader finds the
folder or hub id and writes `best.pt` and `config.yaml`, which every mtkit command then accepts.
A new family is its module and its row in `FAMILIES`. `mtkit import FAMILY` and `mtkit import auto`
call `import_model`.
"""

from __future__ import annotations

from pathlib import Path

from mtkit.config import Config
from mtkit.errors import MtkitError
from mtkit.importers.loader import Family, check_output, family_of, import_family, locate, read_json
from mtkit.importers.m2m100 import M2M100
from mtkit.importers.marian import MARIAN
from mtkit.importers.mbart import MBART
from mtkit.models.base import EncoderDecoder

FAMILIES: dict[str, Family] = {family.name: family for family in (MARIAN, M2M100, MBART)}
AUTO = "auto"  # the family read from config.json


def import_model(source: str, output: Path, *, family: str = AUTO, revision: str | None = None) -> tuple[Config, EncoderDecoder]:
    """Import `source` (a folder, or a hub id at `revision`: a branch, tag or commit, else the newest) of `family`, or
    of the family its config.json names, into `output`."""
    if family != AUTO:
        if family not in FAMILIES:
            raise MtkitError(f"family {family!r}: not one mtkit imports; choose one of {', '.join([*FAMILIES, AUTO])}")
        return import_family(source, output, family=FAMILIES[family], revision=revision)
    check_output(output)
    located = locate(source, None, revision=revision)  # a hub id: its config.json only, until the family is known
    where = located.folder / "config.json"
    family_found = family_of(read_json(where, None), where, families=FAMILIES)
    return import_family(source, output, family=family_found, revision=located.commit or revision)  # the same commit
