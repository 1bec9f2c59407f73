"""transformers copies a folder's remote code into HF_MODULES_CACHE (~/.cache/huggingface/modules) and imports it
from there: the export tests keep those copies in a temporary folder and forget them afterwards."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator

import pytest


def _forget_remote_modules() -> None:
    for name in [name for name in sys.modules if name.split(".")[0] == "transformers_modules"]:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture(scope="module", autouse=True)
def modules_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    dynamic_module_utils = pytest.importorskip("transformers.dynamic_module_utils")
    _forget_remote_modules()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path_factory.mktemp("hf_modules")))
        patch.setattr(sys, "path", list(sys.path))  # the cache folder is appended to it
        yield
    _forget_remote_modules()
