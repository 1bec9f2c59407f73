"""Learning curves from real training: `mtkit plot` draws runs into a PNG others can read, and training draws
curves.png and writes TensorBoard events."""

from __future__ import annotations

import pytest
from helpers import prepared_reverse_task, write_log
from typer.testing import CliRunner

from mtkit.cli import app


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


@pytest.mark.slow
def test_the_png_is_readable_by_others_as_a_new_file_would_be(tmp_path):
    import os

    runs = [write_log(tmp_path / "run", 5.0)]
    CliRunner().invoke(app, ["plot", str(runs[0]), "-o", str(tmp_path / "curves.png")])
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "curves.png").stat().st_mode & 0o777 == 0o666 & ~mask
