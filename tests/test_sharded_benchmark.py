"""benchmarks/sharded.py's estimate of an update's memory, which decides the shapes it skips on a machine (the
whole benchmark runs in its smoke mode in tests/system/test_benchmarks.py)."""

from __future__ import annotations

import argparse

import torch

from benchmarks.sharded import BYTES_A_PARAMETER, SHAPES, build, estimated_gb, measure


def test_the_estimate_counts_every_parameter_and_fsdp_the_largest_gathered_layer_too() -> None:
    with torch.device("meta"):
        model = build(SHAPES["600M"])
    parameters = model.num_parameters()
    assert 600e6 < parameters < 630e6  # NLLB-600M's shape, its 256,206-row embeddings tied
    assert estimated_gb(SHAPES["600M"], 1) == round(BYTES_A_PARAMETER * parameters / 1e9, 1)
    layer = sum(p.numel() for p in model.decoder_layers[0].parameters())  # a decoder layer's, with cross-attention
    assert estimated_gb(SHAPES["600M"], 2) == round((BYTES_A_PARAMETER * parameters + 2 * 8 * layer) / 1e9, 1)


def test_a_shape_over_the_memory_given_is_skipped_without_starting_anything() -> None:
    args = argparse.Namespace(memory_gb=24.0, batch_pairs=8, length=24, threads=1, in_process=False)
    skipped = measure(args, SHAPES["3.3B"], 1)
    assert skipped["skipped"].startswith("needs about ") and skipped["estimated_gb"] > 24
