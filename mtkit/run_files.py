"""A run directory's files, each named here once: every module that writes or reads one goes through `RunFiles`,
which also says which checkpoint `-m RUN` means.

    RUN/config.yaml     the resolved recipe (training, `mtkit import`); read by every command given -m RUN
    RUN/last.pt         weights + optimiser, schedule, RNG and progress: what `--resume` continues from
    RUN/best.pt         the weights that validated best
    RUN/ema.pt          the moving average of the weights (train.ema)
    RUN/average.pt      the mean of the newest step_*.pt (train.average_last, `mtkit average`)
    RUN/step_N.pt       the weights of the newest validations (train.keep)
    RUN/at_LABEL.pt     the weights once training had run LABEL (train.snapshots, e.g. at_15m.pt)
    RUN/log.jsonl       one JSON record a line: training and validation figures
    RUN/curves.png      the learning curves drawn from log.jsonl
    RUN/tensorboard/    the same figures as TensorBoard events (train.tensorboard)
    RUN/sharded/step_N/ the model and optimiser shards of train.shard=fsdp that last.pt names (one file per process)
    RUN/train.lock      held by the one training that writes the directory
    RUN/scores.json     the test/valid scores `mtkit evaluate -m RUN --split` recorded (`mtkit serve`'s /info)
    RUN/shortlist.safetensors  the vocabulary shortlist `mtkit shortlist RUN` built (search's output layer, cut)
    RUN/word_priors.txt        eflomal's word-alignment priors `mtkit priors RUN` built (they place inline tags)
    RUN/sentence_ends.tsv      where the corpus's sentences start and end, built with them (unpunctuated ends)

Which checkpoint `-m RUN` means is decided here (`RunFiles.chosen_weights`, `checkpoint_file`); the
validation score it compares is read from the checkpoints by `mtkit.models.checkpoint.resolve_checkpoint`,
and a training writes the directory through `mtkit.training.run_writer.RunWriter`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mtkit.errors import MtkitError
from mtkit.textio import leftover_temporaries, write_file


@dataclass(frozen=True)
class RunFiles:
    """The paths of one run directory's files."""

    path: Path

    @classmethod
    def of(cls, path: Path | str) -> RunFiles:
        """The run directory `path`, or the one a checkpoint file `path` lies in."""
        path = Path(path)
        return cls(path.parent if path.suffix == ".pt" else path)

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def last(self) -> Path:
        return self.path / "last.pt"

    @property
    def best(self) -> Path:
        return self.path / "best.pt"

    @property
    def ema(self) -> Path:
        return self.path / "ema.pt"

    @property
    def average(self) -> Path:
        return self.path / "average.pt"

    @property
    def log(self) -> Path:
        return self.path / "log.jsonl"

    @property
    def curves(self) -> Path:
        return self.path / "curves.png"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def sharded(self) -> Path:
        return self.path / "sharded"

    def sharded_step(self, step: int) -> Path:
        """RUN/sharded/step_N: update N's shards (train.shard=fsdp), zero-padded as step_N.pt."""
        return self.sharded / self.step(step).stem

    @property
    def lock(self) -> Path:
        return self.path / "train.lock"

    @property
    def scores(self) -> Path:
        return self.path / "scores.json"

    @property
    def shortlist(self) -> Path:
        return self.path / "shortlist.safetensors"

    @property
    def word_priors(self) -> Path:
        return self.path / "word_priors.txt"

    @property
    def sentence_ends(self) -> Path:
        return self.path / "sentence_ends.tsv"

    def weights(self, stem: str) -> Path:
        """RUN/<stem>.pt: best, last, ema or average."""
        return self.path / f"{stem}.pt"

    def step(self, step: int) -> Path:
        """RUN/step_N.pt, zero-padded so that names sort by step."""
        return self.path / f"step_{step:08d}.pt"

    def steps(self) -> list[Path]:
        """The kept step_*.pt, oldest first."""
        return sorted(self.path.glob("step_*.pt"))

    def snapshot(self, label: str) -> Path:
        """RUN/at_<label>.pt: the weights once training had run `label` (a duration such as 15m)."""
        return self.path / f"at_{label}.pt"

    def training_outputs(self) -> list[Path]:
        """What a training writes besides config.yaml and the TensorBoard folder, and the shortlist and priors built
        from its data: what `--overwrite` deletes."""
        named = [self.last, self.best, self.ema, self.average, self.log, self.curves, self.shortlist, self.word_priors]
        named.append(self.sentence_ends)
        return [*self.steps(), *sorted(self.path.glob("at_*.pt")), *named]

    def leftover_temporaries(self) -> list[Path]:
        """The temporary files of writes of a training's files (checkpoints, config.yaml, log.jsonl, curves.png) that a
        killed process left (`textio.atomic_file`'s naming): what a training removes once it holds the lock."""
        names = ["last.pt", "best.pt", "ema.pt", "average.pt", "step_*.pt", "at_*.pt", "config.yaml", "log.jsonl", "curves.png"]
        return [path for name in names for path in leftover_temporaries(self.path, name)]

    def chosen_weights(self, validated_score: Callable[[Path], float | None]) -> Path:
        """Which checkpoint `-m RUN` means: its best-validated final weights. best.pt, or ema.pt (train.ema) or
        average.pt (train.average_last) where their validation score (BLEU, or the run's train.validate_metric)
        is at least as high (a tie goes to an average); last.pt when nothing was validated.
        `validated_score(path)` is the score a checkpoint records (None: not validated as it is)."""
        if not self.best.is_file():
            if self.last.is_file():
                return self.last
            raise MtkitError(
                f"{self.path}: no best.pt or last.pt in this run directory; train a model with `mtkit train RECIPE` first"
            )
        rivals = [path for path in (self.ema, self.average) if path.is_file()]
        if not rivals:
            return self.best  # no score to read
        chosen, top = self.best, validated_score(self.best)
        for path in rivals:
            score = validated_score(path)
            if score is not None and (top is None or score >= top):
                chosen, top = path, score
        return chosen

    def write_config(self, recipe: dict[str, Any]) -> None:
        """config.yaml: a resolved recipe in its plain-data form (`mtkit.config.config_to_dict`), atomically."""
        write_file(self.config, yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True))

    def read_scores(self) -> dict[str, Any] | None:
        """The scores recorded in scores.json, if any (an unreadable file counts as none)."""
        try:
            return json.loads(self.scores.read_text(encoding="utf-8")) if self.scores.is_file() else None
        except (OSError, ValueError):
            return None

    def write_scores(self, scores: dict[str, Any]) -> None:
        """scores.json, atomically."""
        write_file(self.scores, json.dumps(scores, indent=1) + "\n")


def checkpoint_file(path: Path, validated_score: Callable[[Path], float | None]) -> Path:
    """Which file `-m PATH` means: a run directory's chosen weights (`RunFiles.chosen_weights`); a file as it is."""
    if path.is_dir():
        return RunFiles(path).chosen_weights(validated_score)
    if not path.is_file():
        raise MtkitError(f"{path}: no such run directory or checkpoint; pass the run_dir of a trained recipe")
    return path
