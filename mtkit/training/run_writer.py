"""A training's hold on its run directory: the lock, the refuse / overwrite / resume rules, and every
write a training makes there (config.yaml, atomic checkpoint writes of best, last, ema and rotated
step_*.pt, snapshots, the log.jsonl records, the curves), with the repairs a crash may call for once the
lock is held: killed writes' temporary files removed, and on resume the log cut back to last.pt's step.

Only one process writes it: the single training process, or rank 0 under torchrun, but for the shards of
`train.shard=fsdp` (RUN/sharded/step_N, every rank's: `mtkit.training.sharding`), which last.pt names. The files' names
and which checkpoint `-m RUN` means belong to `mtkit.run_files.RunFiles`.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from mtkit.config import Config, config_to_dict
from mtkit.data.tokenizer import TokenizerPair
from mtkit.errors import MtkitError, one_line
from mtkit.models.checkpoint import LORA_PARENT, checkpoint_payload, read_checkpoint, save_checkpoint
from mtkit.run_files import RunFiles
from mtkit.textio import atomic_file, say
from mtkit.training.curves import plot_curves, read_curves
from mtkit.training.progress import Progress

# Drawing curves.png takes at most 1/CURVES_PACE of a training's wall time: after a validation it is redrawn once
# the time since the last drawing is CURVES_PACE times that drawing's cost (the first one's is guessed at
# FIRST_CURVES_S, matplotlib's import included), and always at the end of training.
CURVES_PACE = 20
FIRST_CURVES_S = 2.0


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """The state one validation saves: the weights, their average and everything `--resume` needs."""

    config: Config
    tokenizers: TokenizerPair
    weights: dict[str, torch.Tensor]
    progress: dict[str, Any]  # the trainer's Progress as a dict; its step names step_*.pt
    # optimizer (or, with train.shard=fsdp, sharded: the record of its RUN/sharded folder), scheduler, rng, scaler,
    # ema: last.pt only
    training_state: dict[str, Any]
    ema_weights: dict[str, torch.Tensor] | None = None
    lora_parent: dict[str, str] | None = None  # a LoRA run's parent (its weights are the adapters): every file names it

    def records(self) -> dict[str, Any]:
        """What every checkpoint file of this state holds besides the weights."""
        parent = {LORA_PARENT: self.lora_parent} if self.lora_parent is not None else {}
        return {"progress": self.progress, "step": self.progress["step"], **parent}


class RunWriter:
    """A training's hold on a run directory: locked, and checked against `resume` and `overwrite`, when opened."""

    def __init__(self, path: Path, *, resume: bool = False, overwrite: bool = False, tensorboard: bool = False) -> None:
        """Create and lock `path`; refuse a run that is there without `resume` or `overwrite`, or resume nothing.

        `overwrite` deletes the previous run's checkpoints and log. The lock is held until `close()`
        or the end of the process. `tensorboard`: the log's figures also go to TensorBoard events.
        """
        self.path = Path(path)
        self.files = RunFiles(self.path)
        writer = _summary_writer() if tensorboard else None  # checked before anything is written
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = lock_run_dir(self.path)
        try:
            self._check(resume, overwrite)
        except MtkitError:
            self._lock.close()
            raise
        self._remove_leftover_temporaries()
        self._events = writer(str(self.files.tensorboard)) if writer is not None else None
        self._curves_due_at = time.monotonic() + CURVES_PACE * FIRST_CURVES_S
        self._curves_behind = False  # a validation in log.jsonl that curves.png does not show yet

    def _check(self, resume: bool, overwrite: bool) -> None:
        if resume and not self.files.last.is_file():
            raise MtkitError(f"{self.path}: nothing to resume (no last.pt); drop --resume to start a new run")
        if not resume and self.files.last.is_file():
            if not overwrite:
                raise MtkitError(
                    f"{self.path} already holds a run; use --resume to continue it, "
                    "--overwrite to start again, or --set run_dir=NEW_DIR"
                )
            for path in self.files.training_outputs():
                path.unlink(missing_ok=True)
            shutil.rmtree(self.files.tensorboard, ignore_errors=True)
            shutil.rmtree(self.files.sharded, ignore_errors=True)

    def _remove_leftover_temporaries(self) -> None:
        """Remove the temporary files that killed writes left (checkpoint-sized): under the lock no writer of these
        files is running, so none of them is still being written."""
        if self.files.sharded.is_dir():  # train.shard=fsdp: the shards last.pt does not name were being written
            last = read_checkpoint(self.files.last, mmap=True) if self.files.last.is_file() else {}
            self._remove_shards(keep=last.get("sharded"))
        leftovers = self.files.leftover_temporaries()
        if not leftovers:
            return
        size = sum(path.stat().st_size for path in leftovers)
        for path in leftovers:
            path.unlink(missing_ok=True)
        names = ", ".join(path.name for path in leftovers[:3]) + (", ..." if len(leftovers) > 3 else "")
        say(f"{self.path}: removed {len(leftovers)} temporary files of interrupted writes ({size / 2**20:.1f} MB: {names})")

    def trim_log(self, step: int) -> None:
        """On resume from last.pt at `step`: log.jsonl keeps its whole records of steps up to `step`, and drops a line
        cut short (a full disk or a crash mid-append) and the records of later steps, which are trained again; said
        in one line. Rewritten atomically, and only when something is dropped."""
        log = self.files.log
        if not log.is_file():
            return
        with open(log, "rb") as file:
            verdicts = [_log_line_verdict(line, step) for line in file]
        cut, later = verdicts.count("cut"), verdicts.count("later")
        if not cut and not later:
            return
        with open(log, "rb") as old, atomic_file(log, binary=True) as new:
            new.writelines(line for line, verdict in zip(old, verdicts, strict=True) if verdict == "kept")
        dropped = [f"{cut} line{'s' * (cut > 1)} cut short"] if cut else []
        dropped += [f"{later} record{'s' * (later > 1)} of steps after {step}, trained again"] if later else []
        say(f"{log}: dropped {' and '.join(dropped)}; the log goes on from last.pt's step {step}")

    def take_up(self, progress: Progress) -> None:
        """On resume from last.pt (its `progress`): the log cut back to its step (`trim_log`), and best.pt's own record
        of the best score kept where last.pt's is older (`Progress.take_best`), so best.pt cannot regress. The other
        ranks of a torchrun job take the best score from rank 0 at the first validation."""
        self.trim_log(progress.step)
        if progress.take_best(self._best_progress()):
            best = ", ".join(f"{key} {value}" for key, value in progress.best_record().items())
            newer = f"{self.files.best} (step {progress.best_step}, {best}) is newer than last.pt (step {progress.step})"
            say(f"{newer}: its score stays the one to beat")

    def _best_progress(self) -> dict[str, Any] | None:
        """The progress best.pt was saved with (its step and best score); None without one."""
        if not self.files.best.is_file():
            return None
        return read_checkpoint(self.files.best, mmap=True).get("progress")  # the weights stay on disk

    def close(self) -> None:
        """Close the TensorBoard events and release the lock; another training may then write here."""
        if self._events is not None:
            self._events.close()
        self._lock.close()

    def write_config(self, config: Config) -> None:
        """config.yaml: the resolved recipe of this run."""
        self.files.write_config(config_to_dict(config))

    def append_log(self, record: dict[str, Any]) -> None:
        """One JSON record a line in log.jsonl (and its numbers in TensorBoard's events, with train.tensorboard); a
        failed append (a full disk) is one line, and the line it may have cut is dropped by the next resume."""
        try:
            with open(self.files.log, "a", encoding="utf-8") as log:
                log.write(json.dumps(record) + "\n")
        except OSError as err:
            raise MtkitError(
                f"{self.files.log}: could not append a record ({err.strerror or err}); the checkpoints are intact; "
                "free some space and continue with --resume"
            ) from None
        if self._events is not None:
            for key, value in record.items():
                if key not in ("step", "epoch") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._events.add_scalar(key, value, record["step"])
            self._events.flush()

    def draw_curves(self, *, final: bool = False) -> bool:
        """curves.png: the learning curves in log.jsonl so far. The trainer calls it after each validation, where
        it draws only when due (`CURVES_PACE`), and with `final` at the end, where it draws what is not drawn yet.
        Returns whether it drew; a failed drawing is a warning (the picture is a view of log.jsonl, which holds the
        figures), and the end of training tries again."""
        started = time.monotonic()
        if final and not self._curves_behind:
            return False  # every validation is drawn
        if not final and started < self._curves_due_at:
            self._curves_behind = True
            return False
        drew = self._draw()
        finished = time.monotonic()
        self._curves_due_at, self._curves_behind = finished + CURVES_PACE * (finished - started), not drew
        return drew

    def _draw(self) -> bool:
        """Draw curves.png from log.jsonl; False, with a warning, where it failed."""
        try:
            plot_curves([read_curves(self.path)], self.files.curves)
        except Exception as err:  # noqa: BLE001 - a full disk or a drawing error never costs the training
            fix = f"draw it later with mtkit plot {self.path} -o {self.files.curves}"
            say(f"mtkit: warning: {self.files.curves} not drawn ({one_line(err)}); training goes on; {fix}")
            return False
        return True

    def save(self, checkpoint: Checkpoint, *, best: bool, keep: int) -> None:
        """Write best.pt (when `best`), step_N.pt (only the newest `keep` stay), ema.pt and last.pt.

        Each file is written atomically, last.pt last; a failed write (a full disk) is one line that
        says the previous checkpoints are intact.
        """
        try:
            self._write(checkpoint, best, keep)
        except OSError as err:
            raise MtkitError(
                f"{self.path}: could not write a checkpoint ({err.strerror or err}); the previous checkpoints are intact; "
                "free some space and continue with --resume"
            ) from None

    def _write(self, checkpoint: Checkpoint, best: bool, keep: int) -> None:
        config, tokenizers, step = checkpoint.config, checkpoint.tokenizers, checkpoint.progress["step"]
        extra = checkpoint.records()
        weights = checkpoint_payload(config, tokenizers, weights=checkpoint.weights, **extra)
        if best:
            save_checkpoint(weights, self.files.best)
        if keep > 0:
            save_checkpoint(weights, self.files.step(step))
            for old in self.files.steps()[:-keep]:
                old.unlink()
        if checkpoint.ema_weights is not None:
            save_checkpoint(checkpoint_payload(config, tokenizers, weights=checkpoint.ema_weights, **extra), self.files.ema)
        save_checkpoint({**weights, **checkpoint.training_state}, self.files.last)
        if "sharded" in checkpoint.training_state:
            self._remove_shards(keep=checkpoint.training_state["sharded"])

    def _remove_shards(self, *, keep: dict[str, Any] | None) -> None:
        """Remove RUN/sharded's folders but the one last.pt names (`keep`, its record; None: all): older updates'
        shards, and those of a write that never reached last.pt."""
        for folder in self.files.sharded.iterdir():
            if keep is None or folder.relative_to(self.path).as_posix() != keep["folder"]:
                shutil.rmtree(folder)

    def snapshot(self, checkpoint: Checkpoint, label: str) -> None:
        """Write the current weights (not the EMA) as at_<label>.pt, atomically; a failed write is one line."""
        config, tokenizers = checkpoint.config, checkpoint.tokenizers
        payload = checkpoint_payload(config, tokenizers, weights=checkpoint.weights, **checkpoint.records())
        try:
            save_checkpoint(payload, self.files.snapshot(label))
        except OSError as err:
            raise MtkitError(f"{self.files.snapshot(label)}: could not write the snapshot ({err.strerror or err})") from None


def _log_line_verdict(line: bytes, step: int) -> str:
    """A log.jsonl line on resume from `step`: "kept" (a whole record up to `step`), "later" (a whole record of a
    later step) or "cut" (no line end, or not a record: what a full disk or a crash mid-append leaves)."""
    try:
        record = json.loads(line) if line.endswith(b"\n") else None
    except ValueError:
        record = None
    if not isinstance(record, dict) or type(record.get("step")) is not int:
        return "cut"
    return "kept" if record["step"] <= step else "later"


def lock_run_dir(run_dir: Path) -> IO[str]:
    """Hold an exclusive lock on the run directory while training (released when the process ends)."""
    handle = open(RunFiles(run_dir).lock, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise MtkitError(
            f"{run_dir}: another training is writing to this run directory; wait for it or use another run_dir"
        ) from None
    return handle


def _summary_writer() -> Any:
    """TensorBoard's SummaryWriter class; one clear error when the optional package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise MtkitError(
            "train.tensorboard: true needs the tensorboard package; install it with pip install 'mtkit[tensorboard]' "
            "(or set train.tensorboard=false)"
        ) from None
    return SummaryWriter
