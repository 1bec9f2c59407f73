"""Learning curves (`mtkit plot`, RUN/curves.png) and TensorBoard events, from real training logs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import prepared_reverse_task
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.errors import MtkitError
from mtkit.training.curves import read_curves


def write_log(run: Path, bleu_gain: float) -> Path:
    """A log.jsonl like `mtkit train` writes: loss windows every 50 updates, a validation every 100."""
    run.mkdir(parents=True)
    records = []
    for step in range(50, 401, 50):
        records.append({"step": step, "epoch": 1, "train_loss": 8 - step / 100, "lr": 1e-3, "tokens_per_s": 2500.0})
        if step % 100 == 0:
            bleu = bleu_gain * step / 100
            records.append({"step": step, "epoch": 1, "valid_loss": 5 - step / 200, "valid_bleu": bleu, "elapsed_s": 3 * step})
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.mark.slow
def test_plot_draws_both_runs_into_a_png(tmp_path):
    import matplotlib.image

    runs = [write_log(tmp_path / "small", 5.0), write_log(tmp_path / "large", 8.0)]
    output = tmp_path / "curves.png"
    result = CliRunner().invoke(app, ["plot", *map(str, runs), "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert "drew small, large into" in result.stdout  # the legend's labels, as drawn
    image = matplotlib.image.imread(output)
    assert image.shape[0] >= 400 and image.shape[1] >= 800 and output.stat().st_size > 20_000
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_training_time_is_interpolated_between_validations(tmp_path):
    curves = read_curves(write_log(tmp_path / "run", 5.0))
    assert curves.points["valid_bleu"] == ([100, 200, 300, 400], [5.0, 10.0, 15.0, 20.0])
    assert np.allclose(curves.seconds([50, 100, 250, 400, 500]), [150, 300, 750, 1200, 1500])


def test_a_broken_log_or_a_wrong_output_is_one_clear_error(tmp_path):
    run = write_log(tmp_path / "run", 5.0)
    with open(run / "log.jsonl", "a") as log:
        log.write('{"step": 4\n')
    with pytest.raises(MtkitError, match=r"log.jsonl:13: not a JSON record"):
        read_curves(run)
    result = CliRunner().invoke(app, ["plot", str(tmp_path), "-o", str(tmp_path / "curves.pdf")])
    assert result.exit_code == 2 and "give a .png file" in result.output


@pytest.mark.slow
def test_training_draws_curves_and_writes_tensorboard_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mtkit.training.trainer import train

    config = prepared_reverse_task(tmp_path, max_steps=40, validate_every=20, log_every=10, tensorboard=True)
    train(config)
    assert (config.run_path / "curves.png").stat().st_size > 10_000
    events = EventAccumulator(str(config.run_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train_loss", "lr", "tokens_per_s", "valid_loss", "valid_bleu"} <= tags
    assert [event.step for event in events.Scalars("valid_bleu")] == [20, 40]


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


@pytest.mark.slow
def test_the_png_is_readable_by_others_as_a_new_file_would_be(tmp_path):
    import os

    runs = [write_log(tmp_path / "run", 5.0)]
    CliRunner().invoke(app, ["plot", str(runs[0]), "-o", str(tmp_path / "curves.png")])
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "curves.png").stat().st_mode & 0o777 == 0o666 & ~mask
