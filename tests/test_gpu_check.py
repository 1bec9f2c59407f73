"""The GPU check's budget logic, lever table and turn-taking, on the CPU without training (the whole check runs in
its smoke mode in test_benchmarks.py)."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from benchmarks.gpu import budget as budget_module
from benchmarks.gpu.budget import Budget, parse_estimates
from benchmarks.gpu.levers import COMPILE, Lever, flag, known_levers, lever_variants
from benchmarks.gpu.parts import fastest_compiled
from benchmarks.gpu.runs import Check, best_variant

RECIPE = "recipes/multi30k/transformer.yaml"


def test_no_budget_fits_everything() -> None:
    budget = Budget(None)
    assert budget.left() == math.inf
    assert budget.fits("anything", 1e12)
    assert budget.report()["skipped"] == []


def test_an_item_over_what_is_left_is_skipped_and_reported(capsys: pytest.CaptureFixture[str]) -> None:
    budget = Budget(100.0)
    assert budget.fits("small", 10.0)
    assert not budget.fits("big", 200.0)
    assert [row["item"] for row in budget.report()["skipped"]] == ["big"]
    assert "skipped big" in capsys.readouterr().err


def test_an_estimate_override_decides_for_its_item() -> None:
    budget = Budget(100.0, {"round 3": 1e9, "cold": 1.0})
    assert not budget.fits("round 3", 1.0)
    assert budget.fits("cold", 1e9)


def test_estimates_are_guessed_then_measured_per_model() -> None:
    budget = Budget(None)
    assert budget.estimate("build", "d1024", 3.0) == 3 * budget_module.GUESSES["build"]
    budget.note("build", 4.0, "d1024")
    budget.note("build", 6.0, "d1024")
    assert budget.estimate("build", "d1024", 3.0) == 5.0
    assert budget.estimate("build", "d512") == budget_module.GUESSES["build"]  # another model keeps its guess
    assert budget.report()["measured_s"] == {"build d1024": [4.0, 6.0]}


def test_the_margin_is_kept_back_for_the_end() -> None:
    assert Budget(100.0).left() <= 100.0 * (1 - budget_module.MARGIN)


def test_estimate_options_are_parsed() -> None:
    assert parse_estimates(["compile cold=600", "d512 wmt: round 3=1e9"]) == {"compile cold": 600.0, "d512 wmt: round 3": 1e9}
    with pytest.raises(ValueError, match="ITEM=SECONDS"):
        parse_estimates(["600"])


def test_a_lever_the_config_does_not_know_is_left_out_with_a_note() -> None:
    levers = {"prefetch": flag("train.prefetch"), "future": flag("train.not_a_lever_yet")}
    known, notes = known_levers(RECIPE, [], levers)
    assert list(known) == ["prefetch"]
    assert len(notes) == 1 and "future" in notes[0] and "train.not_a_lever_yet" in notes[0]


def test_lever_variants_are_plain_all_on_and_all_on_but_one() -> None:
    levers = {"a": Lever(on=("x=1",), off=("x=0",)), "b": Lever(on=("y=1",), off=("y=0",))}
    variants = lever_variants(levers)
    eager = list(COMPILE.off)
    assert variants == {
        "plain": [*eager, "x=0", "y=0"],
        "all on": [*eager, "x=1", "y=1"],
        "all on, no a": [*eager, "y=1", "x=0"],
        "all on, no b": [*eager, "x=1", "y=0"],
    }


class FakeRun:
    """Stands in for a TimedTraining: its windows give fixed tokens/s."""

    device = torch.device("cpu")

    def __init__(self, tokens_per_s: float) -> None:
        self.tokens_per_s = tokens_per_s

    def window(self, updates: int, peak: float) -> dict:
        return {"target_tokens_per_s": self.tokens_per_s, "mfu": 0.1, "peak_gpu_mb": None, "padding_fraction": 0.0}


def fake_check(monkeypatch: pytest.MonkeyPatch, seconds: float | None, saved: list[dict]) -> Check:
    args = argparse.Namespace(rounds=3, updates=1, extra=[])
    check = Check(args, Budget(seconds, {"m: round 3": 1e9}), {}, lambda report: saved.append(report))
    check.models = {"m": ("d512", RECIPE, [])}
    speeds = {"slow": 1.0, "fast": 2.0}

    def build(label: str, name: str, overrides: list[str]) -> FakeRun | None:
        if not check.budget.fits(f"{label}: {name}", 1.0):
            return None
        check.report.setdefault("speed", {}).setdefault(label, {})[name] = {"overrides": overrides, "windows": []}
        return FakeRun(speeds[name])

    monkeypatch.setattr(check, "build", build)
    return check


def test_windows_take_turns_while_they_fit_and_the_report_is_saved_after_each(monkeypatch: pytest.MonkeyPatch) -> None:
    saved: list[dict] = []
    check = fake_check(monkeypatch, 3600.0, saved)
    results = check.time_variants("m", {"slow": ["s"], "fast": ["f"]})
    assert [len(row["windows"]) for row in results.values()] == [2, 2]  # the third round did not fit
    assert len(saved) == 4  # one save after each window
    assert [row["item"] for row in check.budget.skipped] == ["m: round 3"]
    assert best_variant(results) == "fast" and isinstance(check.kept["m"], FakeRun)


def test_with_no_time_left_nothing_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    check = fake_check(monkeypatch, 0.0, [])
    assert check.time_variants("m", {"slow": ["s"]}) == {}
    assert [row["item"] for row in check.budget.skipped] == ["m: slow"]
    assert best_variant({}) is None


def test_the_fastest_compiled_way_is_the_one_with_the_best_window() -> None:
    check = Check(argparse.Namespace(), Budget(None), {}, lambda report: None)
    assert fastest_compiled(check) is None  # (b) timed nothing

    def windows(*rates: float) -> dict:
        return {"windows": [{"target_tokens_per_s": rate} for rate in rates]}

    check.report["compile"] = {
        "by layer": {"cold": windows(5.0), "warm": windows(3.0, 9.0)},
        "whole": {"cold": windows(7.0, 8.0)},
        "whole + CUDA graphs": {"cold": {"cut": "stopped"}},
    }
    assert fastest_compiled(check) == "by layer"
