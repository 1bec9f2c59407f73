"""Packed linear weights in a loaded model: a translator decodes with them, and MTKIT_FAST_PATHS=0 loads the
model as it was trained."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtkit.decoding.translator import Translator
from mtkit.models import packed as packed_module
from mtkit.models.packed import PackedLinear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


@pytest.fixture(autouse=True)
def pack_small_weights(monkeypatch):
    """The test models are tiny: pack every linear, not only those of a million weights and more, whatever a
    measurement on this machine would choose (tests/models/test_fast_paths.py)."""
    monkeypatch.setattr(packed_module, "SMALLEST", 0)
    monkeypatch.setenv("MTKIT_FAST_PATHS", "packed")


def test_a_loaded_translator_decodes_with_packed_weights(reverse_run):
    translator = Translator.load(reverse_run.run_path, fast_paths=True)
    assert any(isinstance(m, PackedLinear) for m in translator.engine.model.modules())
    plain = Translator.load(reverse_run.run_path, fast_paths=True)
    for module in plain.engine.model.modules():
        if isinstance(module, PackedLinear):
            module.__class__ = nn.Linear
    sources = ["ein hund läuft", "zwei kinder spielen am strand", "a"]
    for beam in (1, 5):
        assert translator.translate(sources, beam=beam) == plain.translate(sources, beam=beam)


def test_mtkit_fast_paths_0_loads_a_model_as_it_was_trained(reverse_run, monkeypatch):
    packed = Translator.load(reverse_run.run_path, device="cpu", fast_paths=True).engine.model
    assert any(type(m) is PackedLinear for m in packed.modules())
    monkeypatch.setenv("MTKIT_FAST_PATHS", "0")
    plain = Translator.load(reverse_run.run_path, device="cpu", fast_paths=True).engine.model
    assert not any(type(m) is PackedLinear for m in plain.modules())


def test_a_model_loaded_without_fast_paths_is_not_packed(reverse_run):
    plain = Translator.load(reverse_run.run_path, device="cpu").engine.model
    assert not any(type(m) is PackedLinear for m in plain.modules())
