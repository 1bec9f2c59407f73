"""The check's parts, in their order of priority: each does what still fits in the budget and leaves its figures
in the report (written after every variant) under its key."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from benchmarks.gpu.budget import Budget
from benchmarks.gpu.compiled import compiled_run, run_apart
from benchmarks.gpu.levers import known_levers, lever_variants
from benchmarks.gpu.runs import Check, best_variant
from benchmarks.speed import profile_split

LEVER_LABEL = "d512 wmt"  # part (a)'s model and data, whose best variant parts (b) to (e) take up
FALLBACK = "all on, no fused_loss"  # the best eager variant on an H200, for parts run without (a)
COMPILE_SCALE = 1.5  # a larger model's compile against d512's, before one is measured


def variants(check: Check) -> dict[str, list[str]]:
    """The eager lever variants of the levers this config knows (found once; the others noted in the report)."""
    if check.variants is None:
        known, notes = known_levers(Path(check.models[LEVER_LABEL][1]), check.overrides(LEVER_LABEL, []))
        check.report["levers"] = {"timed": list(known), "left_out": notes}
        check.variants = lever_variants(known)
    return check.variants


def best_eager(check: Check) -> tuple[str, list[str]]:
    """Part (a)'s fastest variant and its overrides; where (a) timed none, the fastest measured on an H200
    (docs/performance.md: all on but the fused loss), else "all on"."""
    results = check.report.get("speed", {}).get(LEVER_LABEL, {})
    best = best_variant(results)
    if best is not None:
        return best, results[best]["overrides"]
    known = variants(check)
    fallback = FALLBACK if FALLBACK in known else "all on"
    return fallback, known[fallback]


def levers(check: Check) -> None:
    """(a) d512 6+6 on WMT-length batches, eager: every lever off, all on, and all on but each one, in turns."""
    check.time_variants(LEVER_LABEL, variants(check))
    check.free_memory()


def compiled(check: Check) -> None:
    """(b) the best of (a) compiled in each of --compile-modes' ways: each from a cold compiler cache, and the first
    way again from the cache artifacts its cold run saved, profiled after its windows where "profile" is a part."""
    best, overrides = best_eager(check)
    check.report["compile"] = {}
    for number, (mode, setting) in enumerate(check.args.compile.items()):
        variant = [*overrides, *setting]
        check.report["compile"][mode] = {"variant": f"{best}, compiled {mode}", "overrides": variant}
        compile_stages(check, LEVER_LABEL, mode, variant, warm=number == 0)


def compile_stages(check: Check, label: str, mode: str, variant: list[str], *, warm: bool, key: str = "compile") -> None:
    """`label`'s `variant` compiled `mode`'s way from a cold cache, then (`warm`) from the artifacts the cold run
    saved, each while it fits; the results in report[key][mode]."""
    result = check.report[key][mode]
    spec = {
        "recipe": check.models[label][1],
        "overrides": check.overrides(label, variant),
        **{name: getattr(check.args, name) for name in ("warmup_updates", "updates", "rounds")},
        "peak": check.peak,
    }
    with tempfile.TemporaryDirectory(prefix="mtkit-artifacts-") as scratch:
        artifacts = str(Path(scratch) / "artifacts.bin")
        profiled = check.args.profile_updates if warm and "profile" in check.args.parts else 0
        stages = (("cold", None, artifacts if warm else None, 0), ("warm", artifacts, None, profiled))
        for stage, artifacts_in, artifacts_out, profile_updates in stages[: 2 if warm else 1]:
            kind, model = f"compile {stage}", f"{mode} {check.models[label][0]}"
            if not check.budget.fits(f"{label} compile {mode}: {stage}", compile_estimate(check.budget, kind, mode, model)):
                break
            start = time.perf_counter()
            stage_spec = {**spec, "artifacts_in": artifacts_in, "artifacts_out": artifacts_out}
            stage_spec["profile_updates"] = profile_updates
            result[stage] = compiled_run(stage_spec) if check.args.smoke else run_apart(stage_spec, check.budget.left())
            check.budget.note(kind, time.perf_counter() - start, model)
            print(f"{label} compile {mode} {stage}: {json.dumps(result[stage])[:300]}", file=sys.stderr, flush=True)
            check.save()


def compile_estimate(budget: Budget, kind: str, mode: str, model: str) -> float:
    """What `kind` ("compile cold" or "compile warm") of `mode` costs for `model` ("MODE d1024"): as measured for
    it, else 1.5 times d512's (a compile's cost is mostly its graphs', which the sizes share), else the guess."""
    for key, scale in ((model, 1.0), (f"{mode} d512", COMPILE_SCALE)):
        if f"{kind} {key}" in budget.measured:
            return scale * budget.estimate(kind, key)
    return budget.estimate(kind)


def fastest_compiled(check: Check) -> str | None:
    """The way of compiling (b) measured fastest (its best window, cold or warm); None where (b) timed none."""
    rates = {
        mode: max(window["target_tokens_per_s"] for stage in ("cold", "warm") for window in row.get(stage, {}).get("windows", []))
        for mode, row in check.report.get("compile", {}).items()
        if any(row.get(stage, {}).get("windows") for stage in ("cold", "warm"))
    }
    return max(rates, key=rates.__getitem__) if rates else None


def eager_pair(check: Check, label: str) -> None:
    """(c) and (e): `label`'s model and data, every lever off against the best of (a), in turns."""
    best, overrides = best_eager(check)
    check.time_variants(label, {"plain": variants(check)["plain"], best: overrides})
    check.kept.pop(label, None)
    check.free_memory()


def big_model(check: Check, label: str = "d1024 wmt") -> None:
    """(c) d1024: eager in turns (`eager_pair`), then the best of (a) compiled in the fastest way of (b) (the first of
    --compile-modes where (b) did not run), cold."""
    eager_pair(check, label)
    mode = fastest_compiled(check) if "compile" in check.report else next(iter(check.args.compile))
    if mode is None:  # (b) ran and timed no way of compiling
        return
    best, overrides = best_eager(check)
    variant = [*overrides, *check.args.compile[mode]]
    check.report.setdefault("big_compiled", {})[mode] = {"variant": f"{label}: {best}, compiled {mode}", "overrides": variant}
    compile_stages(check, label, mode, variant, warm=False, key="big_compiled")


def profile(check: Check) -> None:
    """(d) the profiler's split of an update of (a)'s best variant (built again where it was not kept)."""
    best, overrides = best_eager(check)
    run = check.kept.pop(LEVER_LABEL, None) or check.build(LEVER_LABEL, best, overrides)
    if run is None or not check.budget.fits("profile", check.budget.estimate("profile")):
        return
    start = time.perf_counter()
    check.report["profile"] = {"variant": best, **profile_split(run, check.args.profile_updates)}
    check.budget.note("profile", time.perf_counter() - start)
    check.save()
    del run
    check.free_memory()


def parity(check: Check) -> None:
    """(f) d256 on Multi30k trained from the same start for --parity-updates updates, plain in fp32 and with the
    default levers; the validation BLEU of each at the same updates."""
    from mtkit.training.trainer import train

    args, label = check.args, "d256 multi30k"
    plain = variants(check)["plain"]
    curves = check.report["parity"] = {}
    schedule = [f"train.max_steps={args.parity_updates}", f"train.validate_every={args.parity_every}"]
    extra = [*schedule, "train.max_time=null", "train.patience=0", "train.snapshots=''", "train.ema=0"]
    with tempfile.TemporaryDirectory(prefix="mtkit-parity-") as work:
        for name, variant in (("plain fp32", [*plain, "train.precision=fp32"]), ("default", [])):
            if not check.budget.fits(f"parity: {name}", check.budget.estimate("parity run", scale=args.parity_updates / 2000)):
                return
            config = check.config(label, [*variant, *extra, f"run_dir={work}/{len(curves)}"])
            start = time.perf_counter()
            train(config)
            check.budget.note("parity run", time.perf_counter() - start)
            records = [json.loads(line) for line in (config.run_path / "log.jsonl").read_text().splitlines()]
            bleu = {r["step"]: r["valid_bleu"] for r in records if "valid_bleu" in r}
            curves[name] = {"overrides": variant, "valid_bleu": bleu, "seconds": round(time.perf_counter() - start, 1)}
            check.save()
    plain_bleu, fast_bleu = curves["plain fp32"]["valid_bleu"], curves["default"]["valid_bleu"]
    gaps = [abs(fast_bleu[step] - plain_bleu[step]) for step in plain_bleu if step in fast_bleu]
    curves["largest_gap"] = round(max(gaps), 2) if gaps else None


PARTS = {
    "levers": levers,
    "compile": compiled,
    "d1024": big_model,
    "profile": profile,
    "tatoeba": partial(eager_pair, label="d512 tatoeba"),
    "parity": parity,
}
