"""What a recipe asks models to write, checked before any work: one `SyntheticJob` per synthetic corpus, and its cache.

A job's output is keyed by the writing model's weights, the input text and the decoding options
(`fingerprint`): changing any of them writes a new output; nothing else does. The cache lives in
DATA_DIR/synthetic/NAME-KEY/: `chunks/` while the job runs (one file per chunk, written whole, so a
killed job goes on where it stopped), then `SIDE.txt`, one sentence a line in the input's order,
and `job.json`, what wrote it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from mtkit.config import Config, SyntheticDecodeConfig, TrainSource, recipe_key, split_languages
from mtkit.data.corpora import corpus_names
from mtkit.decoding.ct2_engine import is_ctranslate2_export
from mtkit.errors import MtkitError
from mtkit.models.checkpoint import resolve_checkpoint
from mtkit.textio import count_lines

FORMAT = "mtkit-synthetic-1"


@dataclass(frozen=True, kw_only=True)
class SyntheticJob:
    """One synthetic side: `models` translate `input` (the corpus's other side) into `side`."""

    key: str  # the recipe's name of the corpus, e.g. data.train[1]
    name: str  # the corpus's name in reports
    models: list[Path]
    input: Path
    side: str  # "tgt" (translate_with) or "src" (back_translate_with)
    from_lang: str
    to_lang: str
    decode: SyntheticDecodeConfig
    limit: int | None
    folder: Path  # DATA_DIR/synthetic/NAME-KEY

    @property
    def output(self) -> Path:
        return self.folder / f"{self.side}.txt"

    @property
    def chunks(self) -> Path:
        return self.folder / "chunks"

    @property
    def done(self) -> bool:
        return self.output.is_file() and (self.folder / "job.json").is_file()


def plan_jobs(config: Config) -> list[SyntheticJob]:
    """Every synthetic corpus of the recipe as a job, each input and model checked (nothing is translated)."""
    names = corpus_names(config.data.train)
    jobs = []
    for index, source in enumerate(config.data.train):
        if source.generated_side is not None:
            jobs.append(_job(config, source, recipe_key(config.data, "train", index=index), names[index]))
    return jobs


def _job(config: Config, source: TrainSource, key: str, name: str) -> SyntheticJob:
    src_lang, tgt_lang = split_languages(config, source)
    writes_target = source.generated_side == "tgt"
    option = "translate_with" if writes_target else "back_translate_with"
    given = Path(source.src if writes_target else source.tgt)
    if not given.is_file():
        raise MtkitError(f"{given}: file not found; check {key}.{'src' if writes_target else 'tgt'} in the recipe")
    if count_lines(given) == 0:
        raise MtkitError(f"{given}: the file is empty; {key}'s model has nothing to translate")
    models = [Path(model) for model in source.writer_models]
    for model in models:
        if not (model.exists() and (is_ctranslate2_export(model) or model.is_file() or model.is_dir())):
            raise MtkitError(f"{key}.{option}: {model} does not exist; give a run directory, a checkpoint or an export")
    from_lang, to_lang = (src_lang, tgt_lang) if writes_target else (tgt_lang, src_lang)
    decode = source.decode or SyntheticDecodeConfig()
    fingerprint = _fingerprint(models, given, decode, to_lang, source.limit)
    folder = config.data_path / "synthetic" / f"{name}-{fingerprint[:12]}"
    side = "tgt" if writes_target else "src"
    return SyntheticJob(
        key=key, name=name, models=models, input=given, side=side, from_lang=from_lang, to_lang=to_lang, decode=decode,
        limit=source.limit, folder=folder,
    )  # fmt: skip


def _fingerprint(models: list[Path], given: Path, decode: SyntheticDecodeConfig, to_lang: str, limit: int | None) -> str:
    """A hash of what decides the output: the models' weights, the input's bytes, the decoding options."""
    digest = hashlib.sha256(FORMAT.encode())
    for model in models:
        for path in _weight_files(model):
            _hash_file(digest, path)
    _hash_file(digest, given)
    options = {**dataclasses.asdict(decode), "to_lang": to_lang, "limit": limit}
    digest.update(json.dumps(options, sort_keys=True).encode())
    return digest.hexdigest()


def _weight_files(model: Path) -> list[Path]:
    """The files that hold a model's weights and decoding defaults: an export's, or the checkpoint -m means."""
    if is_ctranslate2_export(model):
        return sorted(path for path in model.iterdir() if path.is_file())
    return [resolve_checkpoint(model)]


def _hash_file(digest: hashlib._Hash, path: Path) -> None:
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
