"""Learning curves of a run validated by COMET-QE (train.validate_metric): its score read from the log and drawn in a
panel of its own; a run validated by BLEU keeps its three panels."""

from __future__ import annotations

import json

from helpers import write_log

from mtkit.training import curves
from mtkit.training.curves import plot_curves, read_curves


def drawn_panels(monkeypatch, runs, output) -> list[str]:
    """The titles of the top row plot_curves draws."""
    figures = []
    monkeypatch.setattr(curves, "_save", lambda figure, path: figures.append(figure))
    plot_curves(runs, output)
    [figure] = figures
    return [axes.get_title() for axes in figure.axes[: len(figure.axes) // 2]]


def test_a_run_validated_by_qe_gets_a_panel_of_its_score(tmp_path, monkeypatch):
    run = write_log(tmp_path / "qe", 5.0)
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    for record in records:
        if "valid_bleu" in record:
            record |= {"valid_qe": record["step"] / 1000, "valid_qe_s": 1.0, "best_qe": 0.4}
    (run / "log.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    qe = read_curves(run)
    assert qe.points["valid_qe"] == ([100, 200, 300, 400], [0.1, 0.2, 0.3, 0.4])
    bleu = read_curves(write_log(tmp_path / "bleu", 5.0))
    three = ["training loss", "validation loss", "validation BLEU"]
    assert drawn_panels(monkeypatch, [bleu], tmp_path / "bleu.png") == three
    assert drawn_panels(monkeypatch, [bleu, qe], tmp_path / "both.png") == [*three, "validation COMET-QE"]
