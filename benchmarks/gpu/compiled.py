"""Part (b) of the check: one compiled variant from a cold compiler cache, then again in a fresh process from the
cache artifacts the first saved (torch.compiler.save_cache_artifacts / load_cache_artifacts), so that the second
pays only what a run that starts from a saved cache pays. Each run is a process of its own with empty inductor
and Triton cache folders; in smoke mode both run in this process.

    python -m benchmarks.gpu.compiled SPEC.json RESULT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.speed import TimedTraining, profile_split
from mtkit.config import load_config
from mtkit.textio import write_file


def compiled_run(spec: dict) -> dict:
    """Build the variant (`spec`: recipe, overrides, warmup_updates, updates, rounds, peak, artifacts_in and
    artifacts_out paths or None, profile_updates: 0 or how many updates to profile after the windows), warm it up
    (compiling: its seconds are the compile's), time its windows, profile it where asked, and save the compiler's
    cache artifacts where asked."""
    loaded = None
    if spec["artifacts_in"] and Path(spec["artifacts_in"]).is_file():
        info = torch.compiler.load_cache_artifacts(Path(spec["artifacts_in"]).read_bytes())
        loaded = artifact_counts(info)
    start = time.perf_counter()
    timed = TimedTraining(load_config(spec["recipe"], spec["overrides"]))
    timed.steps(spec["warmup_updates"])
    common.synchronize(timed.device)
    result = {"warmup_s": round(time.perf_counter() - start, 1), "artifacts_loaded": loaded, "windows": []}
    for _ in range(spec["rounds"]):
        if timed.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(timed.device)
        result["windows"].append(timed.window(spec["updates"], spec["peak"]))
    if spec.get("profile_updates"):
        result["profile"] = profile_split(timed, spec["profile_updates"])
    if spec["artifacts_out"]:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            write_file(Path(spec["artifacts_out"]), saved[0])
            result |= {"artifacts_mb": round(len(saved[0]) / 2**20, 2), "artifacts_saved": artifact_counts(saved[1])}
    return result


def artifact_counts(info: object) -> dict[str, int]:
    """How many cache artifacts of each kind (inductor, aot_autograd, autotune, ...) a CacheInfo lists."""
    return {kind: len(keys) for kind, keys in getattr(info, "artifacts", {}).items()}


def run_apart(spec: dict, timeout: float) -> dict:
    """`compiled_run(spec)` in a process of its own with empty compiler caches; {"cut": ...} if it outlasts `timeout`."""
    with tempfile.TemporaryDirectory(prefix="mtkit-compile-") as scratch:
        folder = Path(scratch)
        (folder / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        caches = {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton")}
        command = [sys.executable, "-m", "benchmarks.gpu.compiled", str(folder / "spec.json"), str(folder / "out.json")]
        try:
            done = subprocess.run(command, env={**os.environ, **caches}, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"cut": f"stopped after {timeout:.0f} s, at the end of the budget"}
        if done.returncode:
            return {"failed": f"exit status {done.returncode}; see its output above"}
        return json.loads((folder / "out.json").read_text(encoding="utf-8"))


def main() -> None:
    spec_path, out_path = map(Path, sys.argv[1:3])
    common.write_json(out_path, compiled_run(json.loads(spec_path.read_text(encoding="utf-8"))))


if __name__ == "__main__":
    main()
