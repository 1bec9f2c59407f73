"""The check's data, prepared on this machine and carried to the lent GPU (which reaches no network and has no
../shared): token ids in mtkit's prepared layout and the tokenizers, no model weights, one folder well under the
64 MiB that a call carries.

    DATA/multi30k_8k    d256's Multi30k de-en, joint 8k BPE (the parity run)
    DATA/tatoeba        Tatoeba en-fr whole (149,400 pairs), joint BPE of about 32k pieces (Tatoeba-length figures)
    DATA/tatoeba_wmt    the same pairs, consecutive ones joined to about 30 pieces a side (WMT-length batches):
                        made from DATA/tatoeba where the check runs, so the folder carries Tatoeba once
    DATA/gpu_data.json  what was prepared: vocabulary, pairs and mean pieces a side of each, the folder's size
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc

from benchmarks import common
from mtkit.config import load_config
from mtkit.data.store import REPORT_FILE, load_prepared, prepared_report
from mtkit.data.tokenizer import load_tokenizers
from mtkit.errors import MtkitError
from mtkit.textio import write_file

MANIFEST = "gpu_data.json"
CARRY_LIMIT_MB = 48  # well under the 64 MiB that travels with a call, the working tree included
JOINED_PIECES = 30  # WMT-length: consecutive pairs joined until their sides average this many pieces
MULTI30K = "../shared/data/multi30k"
TATOEBA_VOCAB = 32000  # asked for; SentencePiece gives fewer where the corpus has fewer (a soft limit)


@dataclass(frozen=True, kw_only=True)
class DataSet:
    """One prepared folder: a recipe and its overrides (its data_dir comes from the folder); `joined_from`: the set
    whose corpus and tokenizer it joins pair by pair instead of reading its own."""

    recipe: str
    overrides: tuple[str, ...] = ()
    joined_from: str | None = None


SETS = {
    "multi30k_8k": DataSet(
        recipe="recipes/multi30k/transformer.yaml",
        overrides=(
            f"data.train={{src: {MULTI30K}/train.de.gz, tgt: {MULTI30K}/train.en.gz}}",
            f"data.valid={{src: {MULTI30K}/val.de.gz, tgt: {MULTI30K}/val.en.gz}}",
            "data.test=null",
        ),
    ),
    "tatoeba": DataSet(
        recipe="recipes/tatoeba/general_en_fr.yaml", overrides=(f"tokenizer.vocab_size={TATOEBA_VOCAB}", "data.test=null")
    ),
    "tatoeba_wmt": DataSet(recipe="recipes/tatoeba/general_en_fr.yaml", joined_from="tatoeba"),
}


def smoke_sets(recipe: Path) -> dict[str, DataSet]:
    """--smoke: every set from the tiny recipe's corpus (the joined one joined as the real one is)."""
    return {name: DataSet(recipe=str(recipe), joined_from="tatoeba" if name == "tatoeba_wmt" else None) for name in SETS}


def set_overrides(sets: dict[str, DataSet], data: Path, name: str) -> list[str]:
    """The recipe overrides that point a run at the prepared set `name` under `data`."""
    chosen = sets[name]
    base = sets[chosen.joined_from].overrides if chosen.joined_from else chosen.overrides
    return [*base, f"data_dir={data / name}"]


def prepare(data: Path, sets: dict[str, DataSet], commands: common.MtkitCommands, *, carried_only: bool = False) -> dict:
    """Prepare every set under `data` that is not there yet (`mtkit tokenizer train` and `mtkit prepare`; the
    joined sets from their source's prepared pairs, unless `carried_only`), then write and return the manifest.
    `carried_only` (--prepare-only): an error where the folder outgrows CARRY_LIMIT_MB."""
    for name, chosen in sets.items():
        overrides = set_overrides(sets, data, name)
        if chosen.joined_from is not None:
            if carried_only and (data / name).exists():  # made where the check runs: not carried
                print(f"{data / name}: removed (the check makes it from {chosen.joined_from})", file=sys.stderr)
                shutil.rmtree(data / name)
            elif not carried_only and not (data / name / REPORT_FILE).is_file():
                prepare_joined(data, sets, name, commands)
            continue
        if not (data / name / REPORT_FILE).is_file() and not raw_data_found(chosen.recipe, overrides):
            check_prepared(data, [name])  # says how to prepare it where the raw data is
        common.ensure_prepared(commands, Path(chosen.recipe), overrides)
    manifest = describe(data, [name for name in sets if (data / name / REPORT_FILE).is_file()])
    common.write_json(data / MANIFEST, manifest)
    if carried_only and manifest["size_mb"] > CARRY_LIMIT_MB:
        raise MtkitError(f"{data}: {manifest['size_mb']} MB prepared, over the {CARRY_LIMIT_MB} MB a call may carry")
    return manifest


def prepare_joined(data: Path, sets: dict[str, DataSet], name: str, commands: common.MtkitCommands) -> None:
    """`name`'s folder, made where the check runs (the GPU too: carrying it would double the folder): its source
    set's tokenizer copied, the source's prepared train and valid pairs joined (in a scratch folder), then
    `mtkit prepare` on those."""
    source, target = data / str(sets[name].joined_from), data / name
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != REPORT_FILE:
            shutil.copy2(path, target / path.name)
    with tempfile.TemporaryDirectory(prefix="mtkit-joined-") as scratch:
        overrides = [*set_overrides(sets, data, name)]
        for split, key in (("train", "data.train"), ("valid", "data.valid")):
            src, tgt = write_joined(source, split, Path(scratch))
            overrides.append(f"{key}={{src: {src}, tgt: {tgt}}}")
        print(f"{target}: preparing consecutive pairs joined to about {JOINED_PIECES} pieces a side", file=sys.stderr)
        print(commands.run(["prepare", sets[name].recipe, *common.set_args(overrides)]), file=sys.stderr, end="")


def write_joined(source: Path, split: str, scratch: Path) -> tuple[Path, Path]:
    """The prepared `split` of `source` with consecutive pairs joined by a space until both sides average
    JOINED_PIECES pieces; the two gzipped text files written."""
    table = load_prepared(source, split).table
    lengths = sum(pc.list_value_length(table.column(column)).to_numpy() for column in ("src_ids", "tgt_ids"))
    sources, targets = table.column("src").to_pylist(), table.column("tgt").to_pylist()
    joined, start, pieces = [], 0, 0
    for row, length in enumerate(lengths):
        pieces += int(length)
        if pieces >= 2 * JOINED_PIECES:
            joined.append((" ".join(sources[start : row + 1]), " ".join(targets[start : row + 1])))
            start, pieces = row + 1, 0
    paths = scratch / f"{split}.src.gz", scratch / f"{split}.tgt.gz"
    for side, path in enumerate(paths):
        text = "".join(pair[side] + "\n" for pair in joined)
        write_file(path, gzip.compress(text.encode("utf-8"), mtime=0))
    return paths


def raw_data_found(recipe: str, overrides: list[str]) -> bool:
    """Whether the recipe's training files are on this machine (a lent GPU has no ../shared/data)."""
    source = load_config(recipe, overrides).data.train[0]
    return all(Path(path).is_file() for path in (source.src, source.tgt) if path)


def describe(data: Path, sets: list[str]) -> dict:
    """Each set's vocabulary, train pairs and mean pieces a side, and the folder's size in MB."""
    described = {}
    for name in sets:
        report = prepared_report(data / name) or {}
        train = report.get("splits", {}).get("train", {})
        pairs = train.get("pairs", 0)
        described[name] = {
            "vocab_size": load_tokenizers(data / name, joint=True).src.vocab_size,
            "train_pairs": pairs,
            "mean_src_pieces": round(train.get("src_tokens", 0) / max(pairs, 1), 1),
            "mean_tgt_pieces": round(train.get("tgt_tokens", 0) / max(pairs, 1), 1),
        }
    size = sum(path.stat().st_size for path in data.rglob("*") if path.is_file())
    return {"sets": described, "size_mb": round(size / 2**20, 1)}


def check_prepared(data: Path, names: list[str]) -> dict:
    """The manifest, once every set in `names` is prepared under `data`; else one error saying how to prepare it."""
    missing = [name for name in names if not (data / name / REPORT_FILE).is_file()]
    if missing or not (data / MANIFEST).is_file():
        raise MtkitError(
            f"{data}: no prepared {', '.join(missing) or MANIFEST}; prepare it on a machine with ../shared/data first: "
            f"python -m benchmarks.gpu_check --prepare-only --data {data} (then carry that folder)"
        )
    return json.loads((data / MANIFEST).read_text(encoding="utf-8"))
