"""benchmarks/lora_memory.py's shapes and what it skips (the whole benchmark runs in its smoke mode in
tests/system/test_benchmarks.py)."""

from __future__ import annotations

import pytest

from benchmarks import lora_memory
from benchmarks.lora_memory import SHAPES, SMOKE_SHAPES, SYSTEMS, measure_shape, parameters


def test_the_shapes_are_nllb_200_s_by_the_parameters_its_checkpoints_hold() -> None:
    # transformers' M2M100ForConditionalGeneration of facebook/nllb-200-distilled-600M, -1.3B and -3.3B
    assert {name: parameters(shape) for name, shape in SHAPES.items()} == {
        "600M": 615_073_792,
        "1.3B": 1_370_638_336,
        "3.3B": 3_344_863_232,
    }


# the memory available, in bytes a parameter, and the systems run: the weights take 5 bytes, full fine-tuning 22
MEMORY = {"plenty": (1e6, set(SYSTEMS)), "for the weights": (10, {"mtkit lora", "transformers peft"}), "none": (0, set())}


@pytest.mark.parametrize("memory", list(MEMORY))
def test_a_shape_skips_what_the_memory_available_cannot_hold(monkeypatch, memory) -> None:
    shape = SMOKE_SHAPES["tiny"]
    per_parameter, run = MEMORY[memory]
    monkeypatch.setattr(lora_memory, "available_mb", lambda: parameters(shape) * per_parameter / 2**20)
    started = []
    task = {"shape": shape, "batch_pairs": 2, "length": 3}
    figures = measure_shape(task, lambda task: started.append(task["system"]) or {"seconds": 1.0, "peak_mb": 2.0})
    assert set(started) == run and set(figures["bare_products"]) == {"seconds", "gflop"}
    for system in set(SYSTEMS) - run:
        assert figures[system]["skipped"].startswith("needs about")
    assert ("lora_peak_over_full" in figures) == ("mtkit full" in run)
