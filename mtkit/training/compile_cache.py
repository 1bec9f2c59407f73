"""The compiler's cache kept between runs (`train.compile_cache`): a compiled step's cache artifacts
(`torch.compiler.save_cache_artifacts`: inductor's kernels, AOT-autograd's graphs, autotuning results)
written when a run ends (finished or stopped), and loaded before the first update of the
next run of the same model, levers, precision, device and torch, so that it compiles from them.

torch keeps its own caches under /tmp for as long as they last there; this file is what moves the
compile to a fresh machine or container (copy the folder along, from a machine you trust). What it saves is
measured in docs/performance.md.

The file is code: torch runs the graphs and kernels it holds. So, as ssh does for its keys, a cache folder or
file that another user can write (a group or other write bit, or another owner) is refused before the run
writes anything, and mtkit writes them writable by their owner alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import asdict
from pathlib import Path

import torch

from mtkit.config import Config
from mtkit.errors import MtkitError
from mtkit.runtime import user_cache_folder
from mtkit.textio import say, write_file
from mtkit.training.levers import Levers

OFF = "false"  # YAML reads off and false alike
WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def cache_folder(config: Config) -> Path:
    """The folder `train.compile_cache` names (`auto`: `default_folder`)."""
    setting = config.train.compile_cache
    return default_folder() if setting == "auto" else Path(setting)


def default_folder() -> Path:
    """`auto`'s folder: $MTKIT_CACHE_DIR/compile, else $XDG_CACHE_HOME/mtkit/compile, else ~/.cache/mtkit/compile."""
    return user_cache_folder("compile")


class CompileCache:
    """One compiled step's artifacts file: its name a digest of what decides the compiled code."""

    def __init__(self, config: Config, device: torch.device, *, levers: Levers) -> None:
        folder = cache_folder(config)
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
    def check_folder(cls, config: Config, device: torch.device) -> None:
        """Refuse, before a run writes anything, a cache folder that other users can write (`refuse_shared`), where
        the step is compiled with a cache (the levers' `compile` does not depend on the model)."""
        if cls.of(config, device, levers=Levers.of(config.train, device)) is not None:
            refuse_shared(cache_folder(config))

    @classmethod
    def opened(cls, config: Config, device: torch.device, *, levers: Levers) -> CompileCache | None:
        """`of`, its artifacts loaded where saved."""
        cache = cls.of(config, device, levers=levers)
        if cache is not None:
            cache.load()
        return cache

    def load(self) -> None:
        """Hand the saved artifacts, if any, to torch's caches; a file torch cannot read is said and passed over."""
        refuse_shared(self.path.parent)
        if not self.path.is_file():
            say(f"compiler cache: none yet at {self.path}; this run's is saved there when it ends")
            return
        refuse_shared(self.path)
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
        self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)  # whatever the umask, only its owner writes it
        write_file(self.path, artifacts[0], mode=0o644)
        say(f"compiler cache: saved to {self.path} ({len(artifacts[0]) / 2**20:.1f} MB)")


def refuse_shared(path: Path) -> None:
    """Refuse a compiler cache folder or file (it is code torch runs) that another user can write: a group or other
    write bit, or an owner other than this user (or root). A path that does not exist yet passes."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return
    if status.st_uid not in (os.geteuid(), 0):
        raise MtkitError(
            f"{path}: the compiler cache is code that torch runs, and this one belongs to another user (uid "
            f"{status.st_uid}); set train.compile_cache to a folder of your own (or false)"
        )
    if status.st_mode & WRITABLE_BY_OTHERS:
        raise MtkitError(
            f"{path}: the compiler cache is code that torch runs, and other users can write it (mode "
            f"{stat.S_IMODE(status.st_mode):04o}); run chmod go-w {path}, or set train.compile_cache to a folder of your own"
        )
