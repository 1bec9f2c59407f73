"""The check's timed runs: variants of one model built and warmed up one by one, then timed windows in turns
(A B C ... A B C), each item only where the budget still has room for it, and the JSON written after each."""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable

import torch

from benchmarks import common
from benchmarks.gpu.budget import Budget
from benchmarks.speed import TimedTraining
from mtkit.config import Config, load_config

# What one variant of each model costs, against d512's (the guesses' scale before one is measured)
COST_SCALE = {"d256": 0.5, "d512": 1.0, "d1024": 3.0}


class Check:
    """One check's state: its arguments, budget, report (written after each item) and the model table."""

    def __init__(self, args: argparse.Namespace, budget: Budget, report: dict, save: Callable[[dict], None]) -> None:
        self.args, self.budget, self.report, self._save = args, budget, report, save
        self.models: dict[str, tuple[str, str, list[str]]] = {}  # label -> (model, recipe, overrides with its data)
        self.peak = 0.0  # the bf16 matmul FLOP/s measured in this run
        self.kept: dict[str, TimedTraining] = {}  # label -> the best eager variant, kept for the profile
        self.variants: dict[str, list[str]] | None = None  # the lever variants (levers.lever_variants), once known

    def overrides(self, label: str, variant: list[str]) -> list[str]:
        """The recipe overrides of `label`'s model and data, --set, then the variant's."""
        return [*self.models[label][2], *self.args.extra, *variant]

    def config(self, label: str, variant: list[str]) -> Config:
        return load_config(self.models[label][1], self.overrides(label, variant))

    def scale(self, label: str) -> float:
        """What a variant of `label` costs against one of d512."""
        return COST_SCALE[self.models[label][0]]

    def save(self) -> None:
        self.report["budget"] = self.budget.report()
        self._save(self.report)

    def time_variants(self, label: str, variants: dict[str, list[str]]) -> dict[str, dict]:
        """Build and warm up each variant that fits, then timed windows in turns, round by round while they fit;
        the results by variant (also in report["speed"][label]); the best is kept in `self.kept[label]`."""
        results: dict[str, dict] = self.report.setdefault("speed", {}).setdefault(label, {})
        timed = {name: run for name, overrides in variants.items() if (run := self.build(label, name, overrides))}
        for round_number in range(1, self.args.rounds + 1):
            estimate = self.budget.estimate("window", label, self.scale(label)) * len(timed)
            if not timed or not self.budget.fits(f"{label}: round {round_number}", estimate):
                break
            for name, run in list(timed.items()):
                if run.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(run.device)
                start = time.perf_counter()
                try:
                    results[name]["windows"].append(run.window(self.args.updates, self.peak))
                except Exception as err:  # noqa: BLE001 - as in build()
                    del timed[name], run
                    self.failed(label, name, results[name]["overrides"], err)
                    continue
                self.budget.note("window", time.perf_counter() - start, label)
                self.summarize(results[name])
                self.save()
        best = best_variant(results)
        if best in timed:
            self.kept[label] = timed[best]
        return results

    def build(self, label: str, name: str, overrides: list[str]) -> TimedTraining | None:
        """The variant built and warmed up (its seconds in the report), or None where it does not fit."""
        if not self.budget.fits(f"{label}: {name}", self.budget.estimate("build", label, self.scale(label))):
            return None
        start = time.perf_counter()
        try:
            run = TimedTraining(self.config(label, overrides))
            run.steps(self.args.warmup_updates)
            common.synchronize(run.device)
        except Exception as err:  # noqa: BLE001 - one variant that fails on a lent GPU must not cost the others
            return self.failed(label, name, overrides, err)
        seconds = time.perf_counter() - start
        self.budget.note("build", seconds, label)
        row = {"overrides": overrides, "levers": run.trainer.levers.describe(), "warmup_s": round(seconds, 1), "windows": []}
        self.report.setdefault("speed", {}).setdefault(label, {})[name] = row
        print(f"{label} {name}: built and warmed up in {row['warmup_s']} s", file=sys.stderr, flush=True)
        self.save()
        return run

    def failed(self, label: str, name: str, overrides: list[str], err: Exception) -> None:
        """A variant that raised: its error in the report and on stderr, and the GPU memory handed back."""
        error = f"{type(err).__name__}: {err}"[:500]
        self.report.setdefault("speed", {}).setdefault(label, {})[name] = {"overrides": overrides, "failed": error, "windows": []}
        print(f"{label} {name}: failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        self.save()
        self.free_memory()

    @staticmethod
    def summarize(row: dict) -> None:
        """The row's best window's figures at the row's top."""
        best = max(row["windows"], key=lambda window: window["target_tokens_per_s"])
        row |= {key: best[key] for key in ("target_tokens_per_s", "mfu", "peak_gpu_mb", "padding_fraction")}

    @staticmethod
    def free_memory() -> None:
        """Hand the GPU memory of the runs no longer referenced back (the compiled runs' processes need it)."""
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def best_variant(results: dict[str, dict]) -> str | None:
    """The timed variant with the most target tokens/s; None where none was timed."""
    timed = [name for name, row in results.items() if row.get("windows")]
    return max(timed, key=lambda name: results[name]["target_tokens_per_s"]) if timed else None
