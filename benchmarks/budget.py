"""Quality for the time you have: test BLEU of recipes after each training budget, as a table and JSON.

    python -m benchmarks.budget RECIPE [RECIPE ...] [--times 15m,30m,60m] [--set KEY=VALUE ...]
        [--runs runs/budget] [--output benchmarks/results/budget.json] [--smoke]

Each recipe trains through the CLI (`mtkit train`, then `mtkit evaluate -m RUN/at_<time>.pt --split
test --json`), so every figure comes with the command a user would type. A recipe whose schedule does
not depend on the budget (`inverse_sqrt`, or a decay to `max_steps`) trains once, for the longest
time, with `train.snapshots` at every time: the snapshot at 15 minutes holds the weights a 15-minute
run would end with. A recipe that decays by the share of `train.max_time` (`linear`/`cosine` without
`max_steps`) trains once per time, each run ending at its floor. Runs go to RUNS/<recipe file stem>
(and /<time> for per-budget runs), prepared data where the recipe says (tokenizer training and
`prepare` run first when it is missing). Where a run ends at its budget and `-m RUN` resolves to
its `ema.pt` or `average.pt` (validated better than `best.pt`), that checkpoint is scored too.
The fp32 matmul peak is measured before and after.

Run it on an otherwise idle machine: the recipes are time-budgeted, so anything else running costs
updates. Old recipes compare with new ones side by side in one call (`git show REV:recipes/... >
old.yaml`; the stem names the run, so give old copies another file name).

`--smoke` (no recipe needed): the tiny recipe for budgets of 0.2 and 0.4 seconds, its mtkit
commands run in this process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import common
from benchmarks.common import MtkitCommands, set_args
from mtkit.config import load_config, parse_duration
from mtkit.models.checkpoint import resolve_checkpoint


def budget_dependent(recipe: Path, overrides: list[str]) -> bool:
    """Whether the recipe's schedule decays by the share of train.max_time (so each budget needs its own run)."""
    train = load_config(recipe, overrides).train
    return train.schedule != "inverse_sqrt" and not train.max_steps


def train_runs(
    commands: MtkitCommands, recipe: Path, overrides: list[str], times: list[str], runs: Path
) -> list[tuple[str, Path, Path | None]]:
    """Train the recipe for the budgets; returns (time, snapshot file, run directory if the run ended there) for each."""
    stem = recipe.stem
    if budget_dependent(recipe, overrides):
        plan = [(runs / stem / label, label, [label]) for label in times]
    else:
        plan = [(runs / stem, max(times, key=parse_duration), times)]
    found = []
    for run_dir, longest, snapshots in plan:
        settings = [*overrides, f"run_dir={run_dir}", f"train.max_time={longest}", f"train.snapshots={','.join(snapshots)}"]
        commands.run(["train", recipe, *set_args(settings), "--overwrite"])
        found += [(label, run_dir / f"at_{label}.pt", run_dir if label == longest else None) for label in snapshots]
    return found


def averaged_checkpoint(run_dir: Path | None) -> Path | None:
    """The run's ema.pt or average.pt when `-m RUN` resolves to it (it validated better than best.pt at the end)."""
    chosen = resolve_checkpoint(run_dir) if run_dir is not None else None
    return chosen if chosen is not None and chosen.name in ("ema.pt", "average.pt") else None


def evaluate(commands: MtkitCommands, snapshot: Path) -> dict:
    """Test scores of one snapshot (`mtkit evaluate --split test --json`) and its update count."""
    import torch

    step = torch.load(snapshot, map_location="cpu", weights_only=False)["step"]
    arguments = ["evaluate", "-m", str(snapshot), "--split", "test", "--json"]
    scores = json.loads(commands.run(arguments))["scores"]
    return {
        "snapshot": str(snapshot),
        "updates": step,
        "scores": {name: round(value["score"], 2) for name, value in scores.items()},
        "command": shlex.join(["mtkit", *arguments]),
    }


def study(args: argparse.Namespace, times: list[str], save: Callable[[list[dict]], None]) -> list[dict]:
    """Train and score each recipe in turn; `save(rows)` after each, so a study stopped midway keeps what it measured."""
    commands = MtkitCommands(in_process=args.smoke)
    rows: list[dict] = []
    for recipe in args.recipes:
        common.ensure_prepared(commands, recipe, args.overrides)
        started = time.time()
        for label, snapshot, run_dir in train_runs(commands, recipe, args.overrides, times, args.runs):
            rows.append({"recipe": str(recipe), "time": label, **evaluate(commands, snapshot)})
            print(f"{recipe} after {label}: {rows[-1]['scores']} ({rows[-1]['updates']} updates)", flush=True)
            final = averaged_checkpoint(run_dir)
            if final is not None:  # what `mtkit evaluate -m RUN` scores after this run
                rows[-1]["final"] = {"checkpoint": final.name, **evaluate(commands, final)}
                print(f"{recipe} after {label}, {final.name}: {rows[-1]['final']['scores']}", flush=True)
        rows[-1]["recipe_wall_s"] = round(time.time() - started, 1)
        save(rows)
    return rows


def print_table(rows: list[dict], times: list[str]) -> None:
    print("\ntest BLEU (updates) after each training budget")
    print(f"{'recipe':<44}" + "".join(f"{label:>28}" for label in times))
    for recipe in dict.fromkeys(row["recipe"] for row in rows):
        cells = {row["time"]: table_cell(row) for row in rows if row["recipe"] == recipe}
        print(f"{recipe:<44}" + "".join(f"{cells.get(label, '-'):>28}" for label in times))


def table_cell(row: dict) -> str:
    """BLEU (updates) of the snapshot, and of the run's ema.pt or average.pt where `-m RUN` takes it."""
    cell = f"{row['scores']['BLEU']:.2f} ({row['updates']})"
    final = row.get("final")
    return cell if final is None else f"{cell}, {final['checkpoint'].removesuffix('.pt')} {final['scores']['BLEU']:.2f}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", type=Path, nargs="*", help="the recipes (none with --smoke)")
    parser.add_argument("--times", default="15m,30m,60m", help="training budgets, comma-separated")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override KEY=VALUE")
    parser.add_argument("--runs", type=Path, default=Path("runs/budget"))
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/budget.json"))
    common.add_smoke_options(parser)
    args = parser.parse_args()
    if not args.recipes and not args.smoke:
        parser.error("the following arguments are required: recipes")
    return args


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny recipe (prepared in `work` the first time), trained for 0.2 and 0.4 seconds."""
    args.recipes, args.times, args.runs = [common.smoke_recipe(work)], "0.2s,0.4s", work / "budget"
    args.overrides = [*args.overrides, "train.max_steps=0", "train.validate_every=100000"]  # the time is the budget


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, run_study, args.output)
    print_table(report["rows"], budget_times(args.times))
    peaks = report["matmul_gflop_per_s"]
    print(f"fp32 matmul peak: {peaks[0]} GFLOP/s before, {peaks[1]} after")
    print(f"written to {args.output}")


def budget_times(text: str) -> list[str]:
    """The training budgets of --times, each checked."""
    times = [label.strip() for label in text.split(",") if label.strip()]
    for label in times:
        parse_duration(label)
    return times


def run_study(args: argparse.Namespace) -> dict:
    """The study between two measures of the matmul peak; the report is written after each recipe."""
    times = budget_times(args.times)
    for recipe in args.recipes:
        load_config(recipe, args.overrides)  # every recipe checked whole before anything trains
    report = {
        **common.smoke_label(args),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cores": os.cpu_count()},
        "matmul_gflop_per_s": [common.matmul_gflop_per_s(smoke=args.smoke)],
        "rows": [],
    }
    print(f"fp32 matmul peak before: {report['matmul_gflop_per_s'][0]} GFLOP/s", flush=True)
    rows = study(args, times, lambda rows: common.write_json(args.output, {**report, "rows": rows}))
    report["matmul_gflop_per_s"].append(common.matmul_gflop_per_s(smoke=args.smoke))
    report["rows"] = rows
    return report


if __name__ == "__main__":
    main()
