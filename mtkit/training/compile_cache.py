"""The compiler's cache kept between runs (`train.compile_cache`): a compiled step's cache artifacts
(`torch.compiler.save_cache_artifacts`: inductor's kernels, AOT-autograd's graphs, autotuning results)
written when a run ends (finished or stopped), and loaded before the first update of the
next run of the same model, levers, precision, device and torch, so that it compiles from them.

torch keeps its own caches under /tmp for as long as they last there; this file is what moves the
compile to a fresh machine or container (copy the folder along). What it saves is measured in
docs/performance.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch

from mtkit.config import Config
from mtkit.textio import say, write_file
from mtkit.training.levers import Levers

OFF = "false"  # YAML reads off and false alike


def default_folder() -> Path:
    """`auto`'s folder: $MTKIT_CACHE_DIR/compile, else $XDG_CACHE_HOME/mtkit/compile, else ~/.cache/mtkit/compile."""
    if root := os.environ.get("MTKIT_CACHE_DIR"):
        return Path(root) / "compile"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mtkit" / "compile"


class CompileCache:
    """One compiled step's artifacts file: its name a digest of what decides the compiled code."""

    def __init__(self, config: Config, device: torch.device, *, levers: Levers) -> None:
        setting = config.train.compile_cache
        folder = default_folder() if setting == "auto" else Path(setting)
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        key = {
            "torch": torch.__version__,
            "device": device_name,
            "model": asdict(config.model),
            "levers": asdict(levers),
            "precision": config.train.precision,
            "label_smoothing": config.train.label_smoothing,
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
        self.path = folder / f"{config.model.arch}-{digest}.bin"

    @classmethod
    def of(cls, config: Config, device: torch.device, *, levers: Levers) -> CompileCache | None:
        """The run's cache; None for an eager step, `train.compile_cache: false` (or off), or a torch without
        cache artifacts (before 2.7)."""
        if not levers.compile or config.train.compile_cache == OFF or not hasattr(torch.compiler, "save_cache_artifacts"):
            return None
        return cls(config, device, levers=levers)

    @classmethod
    def opened(cls, config: Config, device: torch.device, *, levers: Levers) -> CompileCache | None:
        """`of`, its artifacts loaded where saved."""
        cache = cls.of(config, device, levers=levers)
        if cache is not None:
            cache.load()
        return cache

    def load(self) -> None:
        """Hand the saved artifacts, if any, to torch's caches; a file torch cannot read is said and passed over."""
        if not self.path.is_file():
            say(f"compiler cache: none yet at {self.path}; this run's is saved there when it ends")
            return
        try:
            info = torch.compiler.load_cache_artifacts(self.path.read_bytes())
        except Exception as err:  # noqa: BLE001 - a stale or torn file costs a cold compile, never the run
            say(f"compiler cache: {self.path} not loaded ({type(err).__name__}: {err}); compiling from scratch")
            return
        count = sum(len(keys) for keys in getattr(info, "artifacts", {}).values())
        say(f"compiler cache: {count} artifacts loaded from {self.path}")

    def save(self) -> None:
        """Write the artifacts of what this process compiled so far, atomically (the previous file stays whole)."""
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_file(self.path, artifacts[0])
        say(f"compiler cache: saved to {self.path} ({len(artifacts[0]) / 2**20:.1f} MB)")
