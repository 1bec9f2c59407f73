"""The training step's levers as one table: a lever is one row, its recipe overrides for on and for off.

Part (a) of the check times, eager, every lever off ("plain"), every lever on ("all on"), and every lever on
but one ("all on, no X"); part (b) compiles the best of those. A row whose key this mtkit's config does not
know yet (a lever still on another branch) is left out with a one-line note, not an error.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from mtkit.config import load_config
from mtkit.errors import MtkitError


@dataclass(frozen=True, kw_only=True)
class Lever:
    """One lever's recipe overrides when on and when off."""

    on: tuple[str, ...]
    off: tuple[str, ...]


def flag(key: str, on: str = "true", off: str = "false") -> Lever:
    """A lever that is one recipe key."""
    return Lever(on=(f"{key}={on}",), off=(f"{key}={off}",))


COMPILE = flag("train.compile")  # part (b), not toggled in part (a): compiling one variant takes minutes
GRAPHS = ["train.cuda_graphs=true", "train.shapes=16"]  # CUDA graphs need bounded shapes
# part (b)'s ways to compile, in their order of priority: each layer on its own (mtkit.training.regional), the same
# with each layer replayed as CUDA graphs, the whole step replayed as CUDA graphs, the whole step
COMPILE_MODES = {
    "by layer": ["train.compile=layers"],
    "by layer + CUDA graphs": ["train.compile=layers", *GRAPHS],
    "whole + CUDA graphs": [*COMPILE.on, *GRAPHS],
    "whole": list(COMPILE.on),
}
LEVERS = {
    "prefetch": flag("train.prefetch"),  # the next batch collated and copied while the GPU works
    "fused_loss": flag("train.fused_loss"),  # output layer and loss fused, chunk by chunk
    # train.length_multiple is not a row: train.shapes takes over from it (the two together are refused).
    "bounded shapes": flag("train.shapes", "16", "0"),  # batches of at most 16 (rows, length) shapes
    "bf16 weights": flag("train.bf16_weights"),  # weights kept in bf16 (fp32 master copy in the optimizer)
    "cudnn attention": flag("train.cudnn_attention"),  # cuDNN's attention kernel, planned once per bounded shape
    # Not rows, because always on: attention by shape (a batch with no padded source row takes the unmasked
    # path) and the non-finite skip on the device (training/update.py: no host sync per update).
}


def known_levers(recipe: Path, overrides: list[str], levers: dict[str, Lever] = LEVERS) -> tuple[dict[str, Lever], list[str]]:
    """The levers whose on and off overrides this config accepts on `recipe` + `overrides`, and a note for each other."""
    known, notes = {}, []
    for name, lever in levers.items():
        try:
            for setting in (lever.on, lever.off):
                load_config(recipe, [*overrides, *setting])
        except MtkitError as err:
            notes.append(f"lever {name!r} left out: {str(err).splitlines()[0].split('; valid keys')[0]}")
            print(f"levers: {notes[-1]}", file=sys.stderr, flush=True)
            continue
        known[name] = lever
    return known, notes


def lever_variants(levers: dict[str, Lever]) -> dict[str, list[str]]:
    """Eager variants: plain (every lever off), all on, and all on but each lever in turn; name -> overrides."""
    eager = list(COMPILE.off)
    every_off = [setting for lever in levers.values() for setting in lever.off]
    every_on = [setting for lever in levers.values() for setting in lever.on]
    variants = {"plain": [*eager, *every_off], "all on": [*eager, *every_on]}
    for name, lever in levers.items():
        others = [setting for other, row in levers.items() if other != name for setting in row.on]
        variants[f"all on, no {name}"] = [*eager, *others, *lever.off]
    return variants
