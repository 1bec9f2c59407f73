"""`Translator.load` changes nothing outside the model it loads unless the caller asks for the fast
paths: no glibc `mallopt`, the same torch threads and flags and signal handlers, and other code's
`nn.Linear` modules (and the class itself) untouched. With `fast_paths=True` they are applied, to
mtkit's own model only (packing all its large linears with `MTKIT_FAST_PATHS=packed`, or those measured faster by
default: the measurement changes nothing else either), and `MTKIT_FAST_PATHS=0` still wins. Run in a child process,
as `mallopt` holds for a whole process."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtkit.config import Config, ModelConfig
from mtkit.data.tokenizer import load_tokenizers
from mtkit.models import build_model
from mtkit.models.checkpoint import checkpoint_payload, save_checkpoint
from mtkit.run_files import RunFiles

# The child: ctypes.CDLL records every lookup of `mallopt` (how `runtime.retain_freed_memory`
# reaches glibc); each stage prints what the process looks like after one `Translator.load`.
CHILD = """
import ctypes, json, os, signal, sys

mallopt_calls = []

class RecordingCDLL(ctypes.CDLL):
    def __getattr__(self, name):
        if name == "mallopt":
            mallopt_calls.append(name)
        return super().__getattr__(name)

ctypes.CDLL = RecordingCDLL

import torch
from torch import nn

from mtkit import Translator


def process():
    return {
        "mallopt": len(mallopt_calls),
        "threads": torch.get_num_threads(),
        "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "signals": [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)],
        "linear_class": sorted(nn.Linear.__dict__),
    }


def stage(**load):
    others = nn.Linear(1024, 1024)  # other code's module, large enough to be packed
    loaded = Translator.load(sys.argv[1], device="cpu", **load).engine.model
    return {
        **process(),
        "others_class": type(others).__name__,
        "packed": sum(type(m).__name__ == "PackedLinear" for m in loaded.modules()),
    }


report = {"before": process(), "default": stage()}
os.environ["MTKIT_FAST_PATHS"] = "0"
report["switched_off"] = stage(fast_paths=True)
os.environ["MTKIT_FAST_PATHS"] = "packed"
report["packed"] = stage(fast_paths=True)
del os.environ["MTKIT_FAST_PATHS"]
report["measured"] = stage(fast_paths=True)
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def untrained_run(reverse_task: Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained Transformer saved as a run's last.pt, with layers large enough to pack (d_model 512)."""
    model_config = ModelConfig(layers=1, d_model=512, heads=8, ffn_dim=2048, dropout=0.0)
    config = dataclasses.replace(reverse_task, model=model_config, run_dir=str(tmp_path_factory.mktemp("untrained")))
    tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    model = build_model(
        config.model, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=tokenizers.joint
    )
    save_checkpoint(checkpoint_payload(config, tokenizers, weights=model.state_dict()), RunFiles(config.run_path).last)
    return config.run_path


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's; elsewhere the fast path is a no-op")
def test_loading_changes_the_process_only_when_fast_paths_are_asked_for(untrained_run):
    environment = {name: value for name, value in os.environ.items() if name != "MTKIT_FAST_PATHS"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(untrained_run)], capture_output=True, text=True, env=environment, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    before = report.pop("before")
    for name in ("default", "switched_off"):
        stage = report[name]
        assert stage.pop("packed") == 0, name
        assert stage.pop("others_class") == "Linear", name
        assert stage == before, name  # no mallopt, same threads, flags, signal handlers and nn.Linear
    mallopt = before.pop("mallopt")
    for name, packed in (("packed", {11}), ("measured", set(range(12)))):  # measured: the shapes that won here
        asked = report[name]
        assert asked.pop("packed") in packed, name  # every linear of encoder (4) and decoder (7); the output is small
        assert asked.pop("others_class") == "Linear", name  # only the model mtkit loaded is packed
        assert asked.pop("mallopt") > mallopt, name
        assert asked == before, name  # the allocator is the only process-wide change
