"""mtkit: neural machine translation from raw parallel text to a scored model (`from mtkit import Translator`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mtkit.constraints import Sampling
    from mtkit.translate import Decoding, Translator

__all__ = ["Decoding", "Sampling", "Translator"]


def __getattr__(name: str) -> Any:
    # Imported on first use so `import mtkit` (and `mtkit --help`) does not load torch.
    if name in __all__:
        import mtkit.translate

        return getattr(mtkit.translate, name)
    raise AttributeError(f"module 'mtkit' has no attribute {name!r}")
