"""CometOptions: which COMET model scores and how, kept free of torch so the CLI reads its defaults."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class CometOptions:
    """Which COMET model scores, and how: every default once (the CLI reads them here)."""

    model: str  # a COMET folder (hparams.yaml, checkpoints/model.ckpt) or a hub id such as Unbabel/wmt22-comet-da
    encoder: Path | None = None  # a folder with the encoder's config.json and tokenizer (offline use)
    device: str = "auto"
    precision: str = "fp32"  # or bf16
    batch_size: int = 16  # sentences a batch
