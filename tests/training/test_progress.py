"""Progress with a validation metric: which validation is the best by BLEU or by COMET, the log's best_* field,
resuming a last.pt of an older mtkit, and which checkpoint `-m RUN` means by the run's metric."""

from __future__ import annotations

import dataclasses

import pytest

from mtkit.errors import MtkitError
from mtkit.models.checkpoint import FORMAT, resolve_checkpoint, save_checkpoint
from mtkit.training.progress import Progress
from mtkit.training.validation import Quality, Validation, best_text, final_weights_report, validation_line

# A last.pt's progress as mtkit wrote it before train.validate_metric: no metric, no best_score.
OLD_PROGRESS = {"step": 40, "epoch": 1, "batches_done": 3, "best_bleu": 20.5, "best_step": 30, "bad_validations": 1,
                "elapsed": 12.0, "skipped_updates": 0, "nonfinite_in_a_row": 0}  # fmt: skip


def validations(progress: Progress, scores: list[tuple[float, float | None]]) -> list[bool]:
    """Record (bleu, comet) validations at steps 10, 20, ...; which of them were the best so far."""
    improved = []
    for step, (bleu, comet) in enumerate(scores, start=1):
        progress.step = 10 * step
        improved.append(progress.record_validation(bleu, comet))
    return improved


def test_bleu_chooses_as_before_and_ignores_a_comet_score():
    progress = Progress()
    assert validations(progress, [(10.0, 0.9), (12.0, 0.1), (11.0, 0.95)]) == [True, True, False]
    assert (progress.best_bleu, progress.best_step, progress.bad_validations) == (12.0, 20, 1)
    assert progress.best == 12.0 and progress.best_record() == {"best_bleu": 12.0}


def test_comet_chooses_the_best_step_and_counts_the_validations_without_a_better_score():
    progress = Progress(metric="comet")
    assert validations(progress, [(10.0, -0.2), (15.0, -0.3), (9.0, 0.4), (20.0, 0.39)]) == [True, False, True, False]
    assert (progress.best_score, progress.best_step, progress.bad_validations) == (0.4, 30, 1)
    assert progress.best_bleu == 9.0  # the best step's BLEU, not the best BLEU
    assert progress.best_record() == {"best_comet": 0.4}
    assert not progress.record_validation(30.0, None)  # no score: never the best by COMET
    assert progress.bad_validations == 2


def test_early_stopping_state_round_trips():
    progress, other = Progress(metric="qe"), Progress(metric="qe")
    validations(progress, [(3.0, 0.25)])
    other.take_early_stopping_state(progress.early_stopping_state())
    assert (other.best_bleu, other.best_step, other.bad_validations, other.best_score) == (3.0, 10, 0, 0.25)


def test_an_old_last_pt_resumes_under_bleu_and_is_refused_under_another_metric():
    progress = Progress.resumed(dict(OLD_PROGRESS), "bleu")
    assert dataclasses.asdict(progress) == {**OLD_PROGRESS, "metric": "bleu", "best_score": float("-inf")}
    assert not progress.record_validation(20.0) and progress.record_validation(21.0)
    with pytest.raises(MtkitError) as caught:
        Progress.resumed(dict(OLD_PROGRESS), "comet")
    message = str(caught.value)
    assert "train.validate_metric comet" in message and "train.validate_metric=bleu" in message and "\n" not in message


def test_the_log_line_names_the_metric_and_its_cost():
    progress = Progress(metric="comet")
    result = Validation(loss=3.1, bleu=20.1, quality=Quality(metric="comet", score=0.73124, seconds=12.34))
    progress.step = 500
    progress.record_validation(result.bleu, result.quality_score)
    assert validation_line(progress, result) == (
        "step 500: valid loss 3.100, BLEU 20.10, COMET 0.7312 (12.3 s) (best COMET 0.7312 at step 500)"
    )
    assert result.record() == {"valid_loss": 3.1, "valid_ppl": 22.2, "valid_bleu": 20.1, "valid_comet": 0.7312,
                               "valid_comet_s": 12.3}  # fmt: skip
    assert best_text(progress) == "COMET 0.7312 (BLEU 20.10)"
    plain = Progress(step=500)
    plain.record_validation(20.1)
    assert (
        validation_line(plain, Validation(loss=3.1, bleu=20.1))
        == "step 500: valid loss 3.100, BLEU 20.10 (best 20.10 at step 500)"
    )
    assert best_text(plain) == "BLEU 20.10"


def test_qe_per_direction_and_the_final_weights_fields():
    quality = Quality(metric="qe", score=0.5, seconds=2.0, directions={"de-en": 0.4, "fr-en": 0.6})
    assert quality.record() == {"valid_qe": 0.5, "valid_qe_s": 2.0, "valid_qe_de-en": 0.4, "valid_qe_fr-en": 0.6}
    progress = Progress(metric="qe", best_score=0.45, best_bleu=19.0)
    fields, said = final_weights_report("ema", Validation(loss=1.0, bleu=20.0, quality=quality), progress=progress)
    assert fields == {"ema_valid_bleu": 20.0, "ema_valid_qe": 0.5, "best_valid_qe": 0.45}
    assert said == "valid BLEU 20.00, COMET-QE 0.5000, best.pt COMET-QE 0.4500"
    fields, said = final_weights_report("average", Validation(loss=1.0, bleu=20.0), progress=Progress(best_bleu=21.0))
    assert (fields, said) == ({"average_valid_bleu": 20.0, "best_valid_bleu": 21.0}, "valid BLEU 20.00, best.pt 21.00")


def save(path, progress: dict, **scores: float) -> None:
    save_checkpoint({"format": FORMAT, "model": {}, "progress": progress, **scores}, path)


def test_run_weights_are_chosen_by_the_runs_metric(tmp_path):
    comet = {**OLD_PROGRESS, "metric": "comet", "best_score": 0.5}
    save(tmp_path / "best.pt", comet)
    save(tmp_path / "average.pt", comet, valid_bleu=99.0, valid_comet=0.4)  # a better BLEU, a worse COMET
    assert resolve_checkpoint(tmp_path).name == "best.pt"
    save(tmp_path / "ema.pt", comet, valid_bleu=1.0, valid_comet=0.6)
    assert resolve_checkpoint(tmp_path).name == "ema.pt"


def test_an_old_run_is_chosen_by_bleu(tmp_path):
    save(tmp_path / "best.pt", OLD_PROGRESS)
    save(tmp_path / "average.pt", OLD_PROGRESS, valid_bleu=20.0)
    assert resolve_checkpoint(tmp_path).name == "best.pt"
    save(tmp_path / "average.pt", OLD_PROGRESS, valid_bleu=20.5)  # a tie goes to the average
    assert resolve_checkpoint(tmp_path).name == "average.pt"


def test_a_best_pt_newer_and_better_than_last_pt_stays_the_best_to_beat():
    last = Progress(step=40, best_bleu=20.0, best_step=30, bad_validations=1)
    assert not last.take_best(None)  # no best.pt
    assert not last.take_best(dataclasses.asdict(Progress(step=30, best_bleu=20.0, best_step=30)))  # the same best
    assert last.take_best(dataclasses.asdict(Progress(step=50, best_bleu=22.0, best_step=50)))  # written after last.pt
    assert (last.best_bleu, last.best_step, last.bad_validations) == (22.0, 50, 1)
    assert not last.record_validation(21.0)  # a worse validation no longer replaces best.pt
    comet = Progress(metric="comet", step=40, best_bleu=20.0, best_step=30, best_score=0.5)
    assert comet.take_best(dataclasses.asdict(Progress(metric="comet", step=50, best_bleu=19.0, best_step=50, best_score=0.6)))
    assert (comet.best_score, comet.best_bleu, comet.best_step) == (0.6, 19.0, 50)
