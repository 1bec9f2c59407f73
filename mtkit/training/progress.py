"""Where a training run stands (`Progress`), saved in last.pt so `--resume` continues exactly."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mtkit.errors import MtkitError


@dataclass(kw_only=True)
class Progress:
    """Where training stands; saved in `last.pt` so `--resume` continues exactly.

    Fields are only ever added, with defaults, so a last.pt of an older mtkit still resumes.
    """

    step: int = 0
    epoch: int = 0
    batches_done: int = 0  # batches of `epoch` already consumed
    best_bleu: float = -1.0  # the best validation BLEU; with a `metric` other than BLEU, the best step's BLEU
    best_step: int = 0
    bad_validations: int = 0
    elapsed: float = 0.0  # seconds of training before this process
    skipped_updates: int = 0  # updates skipped because the loss or gradient was not finite
    nonfinite_in_a_row: int = 0
    metric: str = "bleu"  # train.validate_metric: the score that chooses best.pt and counts toward train.patience
    best_score: float = -math.inf  # with `metric` comet or qe, its best validation score (COMET scores may be negative)

    @classmethod
    def resumed(cls, saved: dict, metric: str) -> Progress:
        """The progress a last.pt holds, continued under `metric`: best.pt was chosen by the saved one, so another
        would compare scores of two metrics; one line instead."""
        progress = cls(**saved)
        if progress.metric != metric:
            raise MtkitError(
                f"train.validate_metric {metric}: the run being resumed chose its best.pt by {progress.metric}; "
                f"resume with --set train.validate_metric={progress.metric}, or start a new run (--set run_dir=NEW_DIR)"
            )
        return progress

    @property
    def best(self) -> float:
        """The best validation score by `metric`."""
        return self.best_bleu if self.metric == "bleu" else self.best_score

    def count(self, *, applied: bool) -> None:
        """Take in an update's outcome, read after its step was counted: a skipped update gives its step back."""
        if applied:
            self.nonfinite_in_a_row = 0
            return
        self.step -= 1
        self.skipped_updates += 1
        self.nonfinite_in_a_row += 1

    def record_validation(self, bleu: float, score: float | None = None) -> bool:
        """Count a validation for early stopping; True when it is the best so far by `metric`: its BLEU, or
        `score`, its COMET or COMET-QE (a validation without one is never the best by those)."""
        if self.metric == "bleu":
            improved = bleu > self.best_bleu
        else:
            improved = score is not None and score > self.best_score
        if improved:
            self.best_bleu, self.best_step, self.bad_validations = bleu, self.step, 0
            if score is not None and self.metric != "bleu":
                self.best_score = score
        else:
            self.bad_validations += 1
        return improved

    def take_best(self, best: dict | None) -> bool:
        """Adopt best.pt's own record of the best score (`best`: the progress it was saved with) where it is better
        than this one's; True if so. A stop between writing best.pt and last.pt leaves a last.pt whose best is
        older: resumed without this, a worse validation than best.pt's would count as the best and overwrite it."""
        if best is None:
            return False
        saved = Progress.resumed(best, self.metric)
        if saved.best <= self.best:
            return False
        self.best_bleu, self.best_score, self.best_step = saved.best_bleu, saved.best_score, saved.best_step
        return True

    def best_record(self) -> dict[str, float]:
        """The best score as log.jsonl reports it: best_bleu, or best_comet / best_qe (named for the metric)."""
        if self.metric == "bleu":
            return {"best_bleu": round(self.best_bleu, 2)}
        return {f"best_{self.metric}": round(self.best_score, 4)}

    def early_stopping_state(self) -> list[float]:
        """What every rank must agree on after a validation (only rank 0 validates; it broadcasts this)."""
        return [self.best_bleu, self.best_step, self.bad_validations, self.best_score]

    def take_early_stopping_state(self, state: list[float]) -> None:
        """Adopt rank 0's `early_stopping_state()`."""
        self.best_bleu, self.best_step, self.bad_validations, self.best_score = state
