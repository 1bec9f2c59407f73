"""Shared test fixtures: small slices of the real Multi30k corpus."""

from __future__ import annotations

import gzip
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def multi30k_dir() -> Path:
    """The gzipped Multi30k corpus ({train,val,test_2016_flickr}.{de,en,fr}.gz), kept next to the repository."""
    directory = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
    assert directory.is_dir(), f"{directory} is missing; clone the repository next to shared/"
    return directory


@pytest.fixture
def multi30k_slice(tmp_path: Path, multi30k_dir: Path) -> Callable[[str, str, int], Path]:
    """Write the first `count` lines of Multi30k `split.lang` to a plain text file in tmp_path."""

    def write(split: str, lang: str, count: int) -> Path:
        source = multi30k_dir / f"{split}.{lang}.gz"
        with gzip.open(source, "rt", encoding="utf-8") as handle:
            text = "".join(itertools.islice(handle, count))
        path = tmp_path / f"{split}.{count}.{lang}"
        path.write_text(text, encoding="utf-8")
        return path

    return write
