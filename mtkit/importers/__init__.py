"""Importers: models trained elsewhere turned into ordinary mtkit run directories.

One module per foreign family (marian.py, m2m100.py, mbart.py; fairseq.py what the last two share) over
the shared loader (loader.py): the family's
`Family` says how config.json names it and reads its folder directly (no foreign library at run
time), refusing what mtkit cannot represent with one line naming the key; the loader finds the
folder or hub id and writes `best.pt` and `config.yaml`, which every mtkit command then accepts.
A new family is its module and its row in `FAMILIES`. `mtkit import FAMILY` and `mtkit import auto`
call `import_model`. The run records its tokenizer's family (`tokenizer.family`), and `run_family` gives the
exporters the rows it names: what a family is stays in its row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mtkit.config import Config
from mtkit.errors import MtkitError
from mtkit.importers.loader import Family, check_output, family_of, import_family, locate, read_json
from mtkit.importers.m2m100 import M2M100
from mtkit.importers.marian import MARIAN
from mtkit.importers.mbart import MBART
from mtkit.importers.names import TokenizerFamily
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


@dataclass(frozen=True)
class RunFamily:
    """The rows of an imported run: its family (the model's class) and its tokenizer's."""

    family: Family
    tokenizer: TokenizerFamily


def run_family(config: Config, codes: list[str]) -> RunFamily | None:
    """The family of an imported run (or of its fine-tuned children) and its tokenizer class: the one the run records
    (`tokenizer.family`); in a run imported before the record, the family whose model keys the run has, its tokenizer
    by how the table writes its language `codes`; None for mtkit's own models."""
    recorded = config.tokenizer.family
    if recorded is not None:
        return _recorded(config, recorded)
    if config.data.lang_tag != "code":  # a run imported before the record without codes: its architecture decides
        return None
    for family in FAMILIES.values():
        if _has_keys(config, family):
            return RunFamily(family, family.tokenizer(None, codes))
    raise MtkitError(
        "the model has language codes (data.lang_tag: code), but neither tokenizer.family nor its model keys name an "
        f"imported family; re-import it with mtkit import (families: {', '.join(FAMILIES)})"
    )


def _recorded(config: Config, recorded: str) -> RunFamily:
    """The rows of the tokenizer family a run records, checked against its model keys."""
    found = [RunFamily(family, held) for family in FAMILIES.values() for held in family.tokenizers if held.name == recorded]
    if not found:
        known = ", ".join(held.name for family in FAMILIES.values() for held in family.tokenizers)
        raise MtkitError(f"tokenizer.family {recorded!r}: not a family mtkit knows; it knows {known}")
    if not _has_keys(config, found[0].family):
        keys = ", ".join(f"model.{key}: {value}" for key, value in found[0].family.model_keys.items())
        raise MtkitError(
            f"tokenizer.family {recorded!r}: the model lacks that family's keys ({keys}); re-import it with mtkit import"
        )
    return found[0]


def _has_keys(config: Config, family: Family) -> bool:
    """Whether the run's model has the keys every import of `family` has."""
    return all(getattr(config.model, key) == value for key, value in family.model_keys.items())
