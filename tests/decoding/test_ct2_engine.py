"""The CTranslate2 engine without a model: a missing package says how to install it (the engine's features
against PyTorch, on an exported model, are in tests/integration/decoding/test_ct2_engine.py)."""

from __future__ import annotations

import sys

import pytest

from mtkit.decoding.ct2_engine import import_ctranslate2
from mtkit.errors import MtkitError


def test_a_missing_ctranslate2_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # makes `import ctranslate2` fail
    with pytest.raises(MtkitError, match="pip install ctranslate2"):
        import_ctranslate2()
