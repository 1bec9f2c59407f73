"""Where a training run stands (`Progress`), saved in last.pt so `--resume` continues exactly."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Progress:
    """Where training stands; saved in `last.pt` so `--resume` continues exactly."""

    step: int = 0
    epoch: int = 0
    batches_done: int = 0  # batches of `epoch` already consumed
    best_bleu: float = -1.0
    best_step: int = 0
    bad_validations: int = 0
    elapsed: float = 0.0  # seconds of training before this process
    skipped_updates: int = 0  # updates skipped because the loss or gradient was not finite
    nonfinite_in_a_row: int = 0

    def count(self, applied: bool) -> None:
        """Take in an update's outcome, read after its step was counted: a skipped update gives its step back."""
        if applied:
            self.nonfinite_in_a_row = 0
            return
        self.step -= 1
        self.skipped_updates += 1
        self.nonfinite_in_a_row += 1

    def record_validation(self, bleu: float) -> bool:
        """Count a validation for early stopping; True when its BLEU is the best so far."""
        improved = bleu > self.best_bleu
        if improved:
            self.best_bleu, self.best_step, self.bad_validations = bleu, self.step, 0
        else:
            self.bad_validations += 1
        return improved
