"""Attention heatmaps (`mtkit translate --plot-attention DIR`): for each of the first N input lines,
a PNG of where each target piece of the best translation looks in the source pieces.

The weights come from the model contract's `cross_attention` (teacher-forced on the translation):
for the Transformer the last decoder layer, averaged over heads or one panel per head; for the
RNN its single attention. matplotlib draws them off-screen (Agg), so no display is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mtkit.config import ModelConfig
from mtkit.data.tokenizer import BOS_ID, EOS_ID
from mtkit.decoding.engine import Capability
from mtkit.decoding.translator import Translation, Translator
from mtkit.errors import OptionError
from mtkit.textio import atomic_file


@dataclass(kw_only=True)
class AttentionMap:
    """weights (H, T, S): target piece t's attention over source piece s, per head."""

    weights: torch.Tensor
    source_pieces: list[str]
    target_pieces: list[str]


@torch.inference_mode()
def attention_map(translator: Translator, line: str, *, target: list[int], tgt_lang: str | None = None) -> AttentionMap:
    """Cross-attention of the model decoding `target` (ids, no BOS/EOS) for the source `line`.

    Rows are the target pieces and a final </s>; columns the source pieces and </s>. A line
    longer than decode.max_input_tokens is shown by its first segment. Needs the PyTorch engine.
    """
    translator.require(Capability.ATTENTION, "plot_attention")
    model, device = translator.engine.model, translator.engine.device
    source = translator.segments(line, translator.language_tag(tgt_lang))[0] + [EOS_ID]
    src = torch.tensor([source], device=device)
    src_mask = torch.ones_like(src, dtype=torch.bool)
    tgt = torch.tensor([[BOS_ID, *target]], device=device)
    weights = model.cross_attention(tgt, model.encode(src, src_mask), src_mask=src_mask)[0].float().cpu()  # (H, T, S)
    return AttentionMap(
        weights=weights,
        source_pieces=translator.tokenizers.src.id_to_piece(source[:-1]) + ["</s>"],
        target_pieces=translator.tokenizers.tgt.id_to_piece(target) + ["</s>"],
    )


def plot_attention(
    translator: Translator,
    *,
    lines: Sequence[str],
    translations: Sequence[Translation],
    directory: Path,
    count: int,
    per_head: bool = False,
    offset: int = 0,
    tgt_lang: str | None = None,
) -> list[Path]:
    """Write attention_NNNN.png (NNNN = input line number) for the first `count` non-empty lines.

    `lines` start at input line `offset + 1` (a later window of a long input), translated into `tgt_lang`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for number, (line, translation) in enumerate(zip(lines, translations, strict=True), start=offset + 1):
        if len(written) >= count:
            break
        if not line.strip():
            continue
        title = f"{model_label(translator.config.model if translator.config else None)}, line {number}"
        figure = _figure(plt, attention_map(translator, line, target=translation.tokens, tgt_lang=tgt_lang), per_head, title)
        path = directory / f"attention_{number:04d}.png"
        with atomic_file(path, binary=True) as file:
            figure.savefig(file, format="png", dpi=100, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


def model_label(model: ModelConfig | None) -> str:
    """The heatmap's title: which model and which of its attentions (plain "attention" if unknown)."""
    if model is None:
        return "attention"
    if model.arch == "transformer":
        return "Transformer, last decoder layer"
    return f"RNN {model.cell.upper()}, {model.attention.replace('_', ' ')} attention"


def check_can_plot(translator: Translator) -> None:
    """A clear error before translating when the engine or the model has no attention to show."""
    translator.require(Capability.ATTENTION, "plot_attention")
    if not translator.engine.model.has_cross_attention:
        raise OptionError(
            "plot_attention", "{plot_attention}: this model has no attention (model.attention: none); drop {plot_attention}"
        )


def _figure(plt, attention: AttentionMap, per_head: bool, title: str):  # noqa: ANN001, ANN202 - matplotlib objects
    heads = attention.weights.size(0)
    panels = [attention.weights.mean(dim=0)] if not per_head else list(attention.weights)
    columns = min(len(panels), 4)
    rows = math.ceil(len(panels) / columns)
    width = max(4.0, 0.32 * len(attention.source_pieces) + 1.5)
    height = max(3.0, 0.28 * len(attention.target_pieces) + 1.2)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False)
    for index, axis in enumerate(axes.flat):
        if index >= len(panels):
            axis.axis("off")
            continue
        image = axis.imshow(panels[index].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        axis.set_xticks(range(len(attention.source_pieces)), attention.source_pieces, rotation=90, fontsize=8)
        axis.set_yticks(range(len(attention.target_pieces)), attention.target_pieces, fontsize=8)
        axis.set_xlabel("source pieces")
        axis.set_ylabel("target pieces")
        label = f"head {index + 1}" if per_head else (f"mean of {heads} heads" if heads > 1 else "attention")
        axis.set_title(f"{title}: {label}", fontsize=9)
        figure.colorbar(image, ax=axis, fraction=0.04)
    return figure
