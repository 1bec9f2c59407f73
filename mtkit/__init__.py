"""mtkit: neural machine translation from raw parallel text to a scored model (`from mtkit import Translator`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mtkit.decoding.options import Decoding, Sampling
    from mtkit.decoding.translator import Translator

# each public name and the module that defines it, imported on first use so that `import mtkit`
# (and `mtkit --help`) does not load torch
_PUBLIC = {
    "Decoding": "mtkit.decoding.options",
    "Sampling": "mtkit.decoding.options",
    "Translator": "mtkit.decoding.translator",
}
__all__ = ["Decoding", "Sampling", "Translator"]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'mtkit' has no attribute {name!r}")
