"""mtkit: neural machine translation from raw parallel text to a scored model (`from mtkit import Translator`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mtkit.translate import Translator

__all__ = ["Translator"]


def __getattr__(name: str) -> Any:
    # Imported on first use so `import mtkit` (and `mtkit --help`) does not load torch.
    if name == "Translator":
        from mtkit.translate import Translator

        return Translator
    raise AttributeError(f"module 'mtkit' has no attribute {name!r}")
