"""The prepared data directory: splits written chunk by chunk, swapped into place whole, opened memory-mapped.

    data_dir/spm.model                    from `mtkit tokenizer train`
    data_dir/{train,valid,test}/data.arrow one Arrow stream file per split, and an `id` file
    data_dir/prepare_report.json          written last; its "id" matches every split's `id`
    data_dir/dropped.tsv                  the training pairs the recipe's filter rules removed (with filters only)

`PreparedWrite` writes every split into data_dir/.prepare-partial/ and moves them into place only
when all are written, so an interrupted or failed prepare leaves the previous data (or none).
`load_prepared` refuses a split whose id does not match the report (a swap cut short) with one line.
Directories written by older versions (datasets' save_to_disk layout) still load.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa

from mtkit.data.tokenizer import Tag, TokenizerPair, tagged
from mtkit.errors import MtkitError
from mtkit.textio import write_file

REPORT_FILE = "prepare_report.json"
DATA_FILE = "data.arrow"
ID_FILE = "id"
PARTIAL_DIR = ".prepare-partial"
DROPPED_FILE = "dropped.tsv"
DROPPED_HEADER = "corpus\trule\twhy\tsource\ttarget\n"
_IDS = pa.list_(pa.int32())
# The columns of a prepared split.
SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string()), ("src_ids", _IDS), ("tgt_ids", _IDS)])
# The training split also says which corpus (an index into the report's "corpora") each pair came from.
TRAIN_SCHEMA = SCHEMA.append(pa.field("corpus", pa.int16()))


class PreparedSplit:
    """A prepared split: an Arrow table, memory-mapped, read as `split["src"]` (a column as a list), `split[i]`
    (a row as a dict), `split[:]` (every column) or `split.table` (the columns as Arrow arrays)."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    @property
    def column_names(self) -> list[str]:
        return self.table.column_names

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            return self.table.column(key).to_pylist()
        if isinstance(key, slice):
            return self.table.slice(*_slice_bounds(key, len(self))).to_pydict()
        index = key + len(self) if key < 0 else key
        if not 0 <= index < len(self):
            raise IndexError(f"row {key} of a split of {len(self)} pairs")
        return {name: values[0] for name, values in self.table.slice(index, 1).to_pydict().items()}


def _slice_bounds(key: slice, length: int) -> tuple[int, int]:
    start, stop, step = key.indices(length)
    if step != 1:
        raise ValueError("a prepared split is sliced with step 1 only")
    return start, max(stop - start, 0)


class SplitWriter:
    """Appends encoded pairs to one split's Arrow stream file and counts its pairs and tokens."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        path.mkdir(parents=True)
        self.schema = schema
        self._sink = pa.OSFile(str(path / DATA_FILE), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)
        self.counts = {"pairs": 0, "src_tokens": 0, "tgt_tokens": 0}

    def write(
        self, pairs: list[tuple[str, str]], tokenizers: TokenizerPair, *, corpus: int, tag: Tag = None, lead: Tag = None
    ) -> None:
        """Encode `pairs` (ids without BOS/EOS; sources after `tag`, targets after `lead`, if any) and append them as
        one record batch; `corpus` goes in a split of several corpora."""
        sources, targets = [src for src, _ in pairs], [tgt for _, tgt in pairs]
        src_ids, tgt_ids = tagged(tokenizers.src.encode_batch(sources), tag), tagged(tokenizers.tgt.encode_batch(targets), lead)
        columns = [pa.array(sources, pa.string()), pa.array(targets, pa.string())]
        columns += [pa.array(src_ids, _IDS), pa.array(tgt_ids, _IDS)]
        if "corpus" in self.schema.names:
            columns.append(pa.array([corpus] * len(sources), pa.int16()))
        self._writer.write_batch(pa.record_batch(columns, schema=self.schema))
        self.counts["pairs"] += len(sources)
        self.counts["src_tokens"] += sum(map(len, src_ids))
        self.counts["tgt_tokens"] += sum(map(len, tgt_ids))

    def close(self) -> dict[str, int]:
        self._writer.close()
        self._sink.close()
        return self.counts


class PreparedWrite:
    """One `mtkit prepare` run's output: `split()` writers under a partial directory, `commit()` to swap in."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.partial = data_dir / PARTIAL_DIR
        self.id = uuid.uuid4().hex
        self.splits: list[str] = []

    def __enter__(self) -> PreparedWrite:
        shutil.rmtree(self.partial, ignore_errors=True)  # what an interrupted prepare left
        self.partial.mkdir(parents=True)
        return self

    def split(self, name: str, schema: pa.Schema = SCHEMA) -> SplitWriter:
        self.splits.append(name)
        return SplitWriter(self.partial / name, schema)

    def start_dropped(self) -> None:
        """Begin the list of the pairs filter rules remove (`add_dropped`), with its header."""
        (self.partial / DROPPED_FILE).write_text(DROPPED_HEADER, encoding="utf-8")

    def add_dropped(self, lines: list[str]) -> None:
        """Append lines (corpus, rule, why, source, target, tab-separated) to the list `start_dropped` began."""
        with open(self.partial / DROPPED_FILE, "a", encoding="utf-8") as listing:
            listing.writelines(lines)

    def commit(self, report: dict[str, Any]) -> None:
        """Move the written splits (and the list of dropped pairs, if begun; an older one goes) into place, replacing
        the old ones, and write the report (with `id`) last."""
        report["id"] = self.id
        (self.data_dir / DROPPED_FILE).unlink(missing_ok=True)
        if (self.partial / DROPPED_FILE).is_file():
            (self.partial / DROPPED_FILE).rename(self.data_dir / DROPPED_FILE)
        for name in self.splits:
            write_file(self.partial / name / ID_FILE, self.id)
        write_file(self.partial / REPORT_FILE, json.dumps(report, indent=2) + "\n")
        (self.data_dir / REPORT_FILE).unlink(missing_ok=True)  # from here until the end, the splits are refused
        old = self.partial / "old"
        old.mkdir()
        for name in ("train", "valid", "test"):
            if (self.data_dir / name).exists():
                (self.data_dir / name).rename(old / name)
            if name in self.splits:
                (self.partial / name).rename(self.data_dir / name)
        (self.partial / REPORT_FILE).rename(self.data_dir / REPORT_FILE)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)


def load_prepared(data_dir: Path, split: str) -> PreparedSplit:
    """Open a split written by `mtkit prepare` (memory-mapped, nothing is loaded into RAM)."""
    path = data_dir / split
    if not path.is_dir():
        raise MtkitError(f"{data_dir}: prepared split '{split}' not found; run `mtkit prepare RECIPE` first")
    if not (path / DATA_FILE).is_file():  # written by an older mtkit with datasets' save_to_disk
        import datasets  # slow to import: only for that layout

        return PreparedSplit(datasets.load_from_disk(str(path)).data.table)
    if _report_id(data_dir) != _split_id(path):
        raise MtkitError(
            f"{data_dir}: the prepared data is incomplete (a `mtkit prepare` was interrupted while replacing it); "
            "run `mtkit prepare RECIPE` again"
        )
    return PreparedSplit(pa.ipc.open_stream(pa.memory_map(str(path / DATA_FILE))).read_all())


def corpus_column(data_dir: Path, dataset: PreparedSplit, *, names: list[str]) -> np.ndarray:
    """Each training pair's corpus index, checked against the recipe's corpora (`names`, in order).

    A split prepared before several corpora existed is one corpus.
    """
    if "corpus" not in dataset.column_names:
        prepared = ["train"]
        column = np.zeros(len(dataset), dtype=np.int16)
    else:
        prepared = [corpus["name"] for corpus in (prepared_report(data_dir) or {}).get("corpora", [])]
        column = dataset.table.column("corpus").to_numpy()
    if len(prepared) != len(names) or (len(names) > 1 and prepared != names):
        raise MtkitError(
            f"{data_dir}: the recipe trains on corpora {', '.join(names)} but the data was prepared from "
            f"{', '.join(prepared) or 'unknown corpora'}; run `mtkit prepare RECIPE` again"
        )
    return column


def prepared_report(data_dir: Path) -> dict[str, Any] | None:
    """The report of the last complete prepare, or None."""
    try:
        return json.loads((data_dir / REPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _report_id(data_dir: Path) -> str | None:
    report = prepared_report(data_dir)
    return report.get("id") if isinstance(report, dict) else None


def _split_id(path: Path) -> str | None:
    try:
        return (path / ID_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
