"""Learning curves from a log: training time between validations, clear errors, and TensorBoard's missing
package (from real training: tests/integration/training/test_curves.py)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import write_log
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.errors import MtkitError
from mtkit.training.curves import read_curves


def test_training_time_is_interpolated_between_validations(tmp_path):
    curves = read_curves(write_log(tmp_path / "run", 5.0))
    assert curves.points["valid_bleu"] == ([100, 200, 300, 400], [5.0, 10.0, 15.0, 20.0])
    assert np.allclose(curves.seconds([50, 100, 250, 400, 500]), [150, 300, 750, 1200, 1500])


def test_a_broken_log_or_a_wrong_output_is_one_clear_error(tmp_path):
    run = write_log(tmp_path / "run", 5.0)
    with open(run / "log.jsonl", "a") as log:
        log.write('{"step": 4\n{"step": 450, "train_loss": 3.0}\n')
    with pytest.raises(MtkitError, match=r"log.jsonl:13: not a JSON record"):
        read_curves(run)
    result = CliRunner().invoke(app, ["plot", str(tmp_path), "-o", str(tmp_path / "curves.pdf")])
    assert result.exit_code == 2 and "give a .png file" in result.output


def test_a_cut_last_line_is_skipped_and_named(tmp_path):
    run = write_log(tmp_path / "run", 5.0)
    whole = read_curves(run)
    assert whole.cut_line is None
    with open(run / "log.jsonl", "a") as log:
        log.write('{"step": 450, "train_lo')  # a crash or a full disk mid-append
    cut = read_curves(run)
    assert cut.points == whole.points and cut.clock == whole.clock
    assert cut.cut_line == f"{run / 'log.jsonl'}:13"


def test_tensorboard_without_its_package_is_one_clear_error_before_anything_is_written(tmp_path, monkeypatch):
    import builtins

    from mtkit.training.run_writer import RunWriter

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name == "torch.utils.tensorboard":
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(MtkitError, match=r"pip install 'mtkit\[tensorboard\]'"):
        RunWriter(tmp_path / "run", tensorboard=True)
    assert not (tmp_path / "run").exists()


def test_curves_take_a_twentieth_of_the_training_time_at_most_and_are_drawn_at_the_end(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from mtkit.training import run_writer

    clock, drawn = [1000.0], []

    def one_second_drawing(runs, output):
        drawn.append(clock[0])
        clock[0] += 1.0

    monkeypatch.setattr(run_writer, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(run_writer, "plot_curves", one_second_drawing)
    writer = run_writer.RunWriter(write_log(tmp_path / "run", 5.0))
    try:
        assert not writer.draw_curves(final=True)  # nothing validated since the start: nothing to draw
        clock[0] += 39.0
        assert not writer.draw_curves()  # the first drawing (guessed at 2 s) is due 40 s into the run
        clock[0] += 1.0
        assert writer.draw_curves() and drawn == [1040.0]
        clock[0] += 19.0
        assert not writer.draw_curves()  # it took 1 s: the next is due 20 s after it ended
        assert writer.draw_curves(final=True) and drawn == [1040.0, 1060.0]  # the end draws the validation left behind
        assert not writer.draw_curves(final=True)
        clock[0] += 20.0
        assert writer.draw_curves() and drawn[-1] == 1081.0
    finally:
        writer.close()
