"""Learning curves (`mtkit plot RUN [RUN ...] -o curves.png`, and RUN/curves.png during training).

From each run's log.jsonl: training loss, validation loss and validation BLEU (and the COMET or
COMET-QE of a run validated by it, `train.validate_metric`), against updates (top row) and against
training wall-clock time (bottom row), the runs overlaid and labelled by their
directory names. Validation records carry the elapsed training time; a training-loss record's time
is interpolated between them (and extrapolated at the last validation's pace). matplotlib draws
off-screen (Agg), and the image replaces the previous one only once complete.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtkit.errors import MtkitError
from mtkit.run_files import RunFiles
from mtkit.textio import atomic_file, file_lines, say

PANELS = (("train_loss", "training loss"), ("valid_loss", "validation loss"), ("valid_bleu", "validation BLEU"))
# a panel of its own when a run validated by COMET has the score (train.validate_metric)
QUALITY_PANELS = (("valid_comet", "validation COMET"), ("valid_qe", "validation COMET-QE"))
LEGEND_ROW_INCHES, TITLE_INCHES = 0.3, 0.45  # the fixed room above the panels (`_leave_margins`)
DIRECTION_BLEU = "valid_bleu_"  # a multilingual run's BLEU of one direction: valid_bleu_de-en, drawn dashed with the mean


@dataclass(kw_only=True)
class RunCurves:
    """One run's curves: for each panel key, (steps, values)."""

    label: str
    points: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    clock: tuple[list[int], list[float]] = ([0], [0.0])  # (steps, elapsed seconds) of the validations
    cut_line: str | None = None  # LOG:N of a last line that is not a whole record (a crash mid-append), skipped

    def seconds(self, steps: Sequence[int]) -> np.ndarray:
        """Training time in seconds at `steps`, interpolated through the validations' clock."""
        known_steps, seconds = np.asarray(self.clock[0], float), np.asarray(self.clock[1], float)
        pace = seconds[-1] / known_steps[-1] if known_steps[-1] > 0 else 0.0  # seconds per update
        at = np.asarray(steps, float)
        found = np.interp(at, known_steps, seconds)
        beyond = at > known_steps[-1]
        found[beyond] = seconds[-1] + (at[beyond] - known_steps[-1]) * pace
        return found


def read_curves(run: Path) -> RunCurves:
    """The curves of a run directory (or of a log.jsonl file). A last line that is not a whole record (what a full disk
    or a crash mid-append leaves; `--resume` drops it) is skipped and its number kept in `cut_line`; any other is an
    error."""
    log = RunFiles(run).log if run.is_dir() else run
    if not log.is_file():
        raise MtkitError(f"{run}: no log.jsonl; give a run directory that `mtkit train` wrote")
    curves = RunCurves(label=run.name if run.is_dir() else run.parent.name)
    clock = ([0], [0.0])
    for number, record in _records(log):
        if record is None:
            curves.cut_line = f"{log}:{number}"
            continue
        directions = [key for key in record if key.startswith(DIRECTION_BLEU) and isinstance(record[key], (int, float))]
        for key in [name for name, _ in PANELS + QUALITY_PANELS] + directions:
            if key in record:
                steps, values = curves.points.setdefault(key, ([], []))
                steps.append(record["step"])
                values.append(record[key])
        if "elapsed_s" in record:
            clock[0].append(record["step"])
            clock[1].append(record["elapsed_s"])
    curves.clock = clock
    return curves


def _records(log: Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(line number, record) of the whole records in `log`; a bad line is an error once a line follows it, and a bad
    last line comes last with None."""
    bad: MtkitError | None = None
    fix = " (is it a training log? give a run directory that `mtkit train` wrote)"
    for number, line in file_lines(log, fix=fix):
        if bad is not None:
            raise bad
        try:
            record = json.loads(line)
        except ValueError:
            bad = MtkitError(f"{log}:{number}: not a JSON record; was the file edited or cut short?")
            continue
        if not isinstance(record, dict) or type(record.get("step")) is not int:
            bad = MtkitError(f"{log}:{number}: not a training log record (no step); give a run directory `mtkit train` wrote")
            continue
        yield number, record
    if bad is not None:
        yield number, None


def plot_curves(runs: Sequence[RunCurves], output: Path) -> list[str]:
    """Draw the runs' curves into `output` (PNG); returns the labels in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = PANELS + tuple(panel for panel in QUALITY_PANELS if any(panel[0] in run.points for run in runs))
    bleu = len(PANELS) - 1  # the BLEU column, where a multilingual run's directions are drawn too
    figure, axes = plt.subplots(2, len(panels), figsize=(5 * len(panels), 8), squeeze=False)
    longest = max((run.clock[1][-1] for run in runs), default=0.0)
    unit, per_unit = ("hours", 3600) if longest > 3 * 3600 else ("minutes", 60)
    for run in runs:
        for column, (key, title) in enumerate(panels):
            steps, values = run.points.get(key, ([], []))
            marker = "." if key != "train_loss" else None  # validations are few: show each
            axes[0][column].plot(steps, values, marker=marker, label=run.label)
            axes[1][column].plot(run.seconds(steps) / per_unit, values, marker=marker, label=run.label)
            axes[0][column].set_title(title)
        for key in sorted(key for key in run.points if key.startswith(DIRECTION_BLEU)):
            steps, values = run.points[key]
            label = f"{run.label} {key.removeprefix(DIRECTION_BLEU)}"
            axes[0][bleu].plot(steps, values, linestyle="--", linewidth=1, label=label)
            axes[1][bleu].plot(run.seconds(steps) / per_unit, values, linestyle="--", linewidth=1, label=label)
    for column in range(len(panels)):
        axes[0][column].set_xlabel("updates")
        axes[1][column].set_xlabel(f"training time ({unit})")
    handles, labels = axes[0][bleu].get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper center", ncol=min(len(labels), 4))
    _leave_margins(figure, legend_rows=-(-len(labels) // 4))
    _save(figure, output)
    plt.close(figure)
    return labels


def _leave_margins(figure: Any, legend_rows: int) -> None:
    """Place the panels with fixed margins: room for the tick labels, axis labels, titles and the legend's rows above
    them. matplotlib's tight_layout measures every text first, which cost as much as the drawing itself."""
    width, height = figure.get_size_inches()
    top = LEGEND_ROW_INCHES * legend_rows + TITLE_INCHES
    figure.subplots_adjust(
        left=0.75 / width, right=1 - 0.25 / width, bottom=0.6 / height, top=1 - top / height, wspace=0.22, hspace=0.3
    )


def plot_runs(runs: Sequence[Path], output: Path) -> list[str]:
    """`mtkit plot`: read each run's log.jsonl and draw them together; returns the labels drawn. Says on stderr which
    log's cut last line it skipped."""
    if output.suffix.lower() != ".png":
        raise MtkitError(f"-o {output}: give a .png file, such as curves.png")
    if not output.parent.is_dir():
        raise MtkitError(f"-o {output}: its directory does not exist; create it or choose another")
    curves = [read_curves(run) for run in runs]
    for read in curves:
        if read.cut_line is not None:
            say(f"mtkit: warning: {read.cut_line}: skipped a last line cut short (a crash or a full disk mid-write)")
    return plot_curves(curves, output)


def _save(figure: object, output: Path) -> None:
    """Write the PNG under a temporary name and rename it, so a reader never sees half an image."""
    with atomic_file(output, binary=True) as file:
        figure.savefig(file, format="png", dpi=80)  # type: ignore[attr-defined]
