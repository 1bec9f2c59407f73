"""Generation as a job: each synthetic side translated chunk by chunk, resumable, on one or several processes.

`synthesize(config)` runs what `plan_jobs` found (cached jobs are not run again) and returns the
recipe with each synthetic corpus reading its generated file, for `mtkit prepare`. Every chunk of
`CHUNK_LINES` input lines is written whole as its own file, so Ctrl-C or kill -9 loses at most the
chunk in progress. Under torchrun, rank r translates chunks r, r + N, ...; rank 0 joins them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import sys
import time

from mtkit.config import Config, recipe_key
from mtkit.decoding.options import Decoding, Sampling
from mtkit.decoding.translator import Translator
from mtkit.distributed import Distributed, barrier, distributed_translation
from mtkit.errors import MtkitError
from mtkit.synthetic.jobs import FORMAT, SyntheticJob, plan_jobs
from mtkit.textio import atomic_file, count_lines, file_lines, say, write_file

CHUNK_LINES = 1_000  # input lines translated and written together: what a killed job can lose


def synthesize(config: Config, device: str = "auto", *, fast_paths: bool = False) -> Config | None:
    """Generate every synthetic side not cached yet; the recipe with those corpora reading their files
    (None on a torchrun rank other than 0, which has nothing more to do). fast_paths: see `Translator.load`."""
    jobs = plan_jobs(config)  # every input and model checked before any work
    if not jobs:
        return config
    with distributed_translation(device) as (distributed, rank_device):
        for job in jobs:
            if job.done:
                say(f"{job.key}: {job.output} is cached (same models, input and decoding)", distributed=distributed)
            else:
                run_job(job, distributed, device=str(rank_device), fast_paths=fast_paths)
    return resolved(config, jobs) if distributed.is_main else None


def resolved(config: Config, jobs: list[SyntheticJob]) -> Config:
    """The recipe with each synthetic corpus reading its generated side (and keeping its name)."""
    train = list(config.data.train)
    by_key = {job.key: job for job in jobs}
    for index, source in enumerate(train):
        job = by_key.get(recipe_key(config.data, "train", index=index))
        if job is not None:
            sides = (
                {"src": str(job.input), "tgt": str(job.output)}
                if job.side == "tgt"
                else {"src": str(job.output), "tgt": str(job.input)}
            )
            train[index] = dataclasses.replace(source, **sides, name=job.name, translate_with=None, back_translate_with=None)
    return dataclasses.replace(config, data=dataclasses.replace(config.data, train=train))


def run_job(job: SyntheticJob, distributed: Distributed, *, device: str, fast_paths: bool = False) -> None:
    """Translate `job.input` chunk by chunk (skipping chunks already written), then join the chunks (rank 0)."""
    translator = Translator.load(job.models, device=device, fast_paths=fast_paths)
    check_direction(job, translator)
    total = min(count_lines(job.input), job.limit or sys.maxsize)
    job.chunks.mkdir(parents=True, exist_ok=True)
    models = " + ".join(map(str, job.models))
    say(f"{job.key}: {models} translates {job.input} ({total:,} lines) into {job.output}", distributed=distributed)
    clock, done, started = time.monotonic(), 0, 0
    for index, window in enumerate(_windows(job, total)):
        path = job.chunks / f"{index:06d}.txt"
        if index % distributed.world_size != distributed.rank or path.is_file():
            started += len(window) if path.is_file() else 0
            continue
        translations = translator.translate_nbest(window, _decoding(job, translator, index))
        write_file(path, "".join(found[0].text + "\n" for found in translations))
        done += len(window)
        _progress(distributed, job, done * distributed.world_size + started, total, done / max(time.monotonic() - clock, 1e-9))
    barrier(distributed)
    if distributed.is_main:
        _join(job, total)
    barrier(distributed)


def check_direction(job: SyntheticJob, translator: Translator) -> None:
    """A model must translate the corpus's given side into the side it writes, before any work."""
    config, option = translator.config, "translate_with" if job.side == "tgt" else "back_translate_with"
    if config is None:
        return
    targets = translator.target_languages if translator.tagged else [config.tgt_lang]
    known_source = config.src_lang in ("src", job.from_lang)  # "src": a model that does not name its languages
    if not known_source or not ({"tgt", job.to_lang} & set(targets)):
        raise MtkitError(
            f"{job.key}.{option}: {job.models[0]} translates {config.src_lang} -> {', '.join(targets)}, but this corpus "
            f"needs {job.from_lang} -> {job.to_lang}; give a model of that direction"
        )


def _decoding(job: SyntheticJob, translator: Translator, chunk: int) -> Decoding:
    decode = job.decode
    drawn = Sampling.parse(decode.sampling, decode.temperature, seed=decode.seed + chunk) if decode.sampling else None
    lang = job.to_lang if translator.tagged else None
    return Decoding(beam=None if drawn else decode.beam, length_penalty=decode.length_penalty, sampling=drawn, tgt_lang=lang)


def _windows(job: SyntheticJob, total: int):  # noqa: ANN202 - an iterator of lists of lines
    lines = (text for _, text in file_lines(job.input, fix=f" (the input of {job.key})"))
    limited = itertools.islice(lines, total)
    while window := list(itertools.islice(limited, CHUNK_LINES)):
        yield window


def _join(job: SyntheticJob, total: int) -> None:
    """SIDE.txt from the chunks in order (atomically), job.json beside it, the chunks removed."""
    parts = sorted(job.chunks.glob("*.txt"))
    expected = -(-total // CHUNK_LINES)
    if len(parts) != expected:
        raise MtkitError(f"{job.chunks}: {len(parts)} of {expected} chunks written; run `mtkit prepare` again to finish")
    with atomic_file(job.output, binary=True) as output:
        for part in parts:
            output.write(part.read_bytes())
    note = {"format": FORMAT, "models": list(map(str, job.models)), "input": str(job.input), "lines": total}
    note |= {"side": job.side, "to_lang": job.to_lang, "decode": dataclasses.asdict(job.decode)}
    write_file(job.folder / "job.json", json.dumps(note, indent=1) + "\n")
    shutil.rmtree(job.chunks, ignore_errors=True)


def _progress(distributed: Distributed, job: SyntheticJob, done: int, total: int, rate: float) -> None:
    rate *= distributed.world_size  # every rank translates at about this rank's rate
    left = (total - min(done, total)) / max(rate, 1e-9)
    message = f"{job.name}: {min(done, total):,}/{total:,} sentences, {rate:.1f} sentences/s, {_clock(left)} left"
    say(message, distributed=distributed)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"
