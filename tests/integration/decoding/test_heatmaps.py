"""Attention heatmaps of trained models: the maps' rows are distributions over labelled pieces, and
`translate --plot-attention` writes one PNG per sentence for both architectures."""

from __future__ import annotations

import pytest
import torch
from matplotlib.image import imread
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.decoding.heatmaps import attention_map
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator

LINES = "a b c\n\nd e f g h\nh i j\n"


def test_transformer_map_rows_are_distributions_over_labelled_pieces(reverse_run):
    translator = Translator.load(reverse_run.run_path)
    best = translator.translate_nbest(["a b c d"], Decoding(beam=1))[0][0]
    attention = attention_map(translator, "a b c d", target=best.tokens)
    heads = reverse_run.model.heads
    assert attention.weights.shape == (heads, len(best.tokens) + 1, len(attention.source_pieces))
    torch.testing.assert_close(attention.weights.sum(-1), torch.ones(heads, len(best.tokens) + 1))
    assert attention.source_pieces[-1] == attention.target_pieces[-1] == "</s>"
    assert "".join(attention.source_pieces[:-1]).replace("\u2581", " ").split() == ["a", "b", "c", "d"]
    assert "".join(attention.target_pieces[:-1]).replace("\u2581", " ").split() == best.text.split()


def test_translate_writes_a_heatmap_per_sentence_for_the_transformer(reverse_run, tmp_path):
    mean, heads = tmp_path / "mean", tmp_path / "heads"
    arguments = ["translate", "-m", str(reverse_run.run_path), "--beam", "2", "--plot-count", "2"]
    result = CliRunner().invoke(app, [*arguments, "--plot-attention", str(mean)], input=LINES)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["c b a", "", "h g f e d", "j i h"]
    assert sorted(p.name for p in mean.iterdir()) == ["attention_0001.png", "attention_0003.png"]
    per_head = CliRunner().invoke(app, [*arguments, "--plot-attention", str(heads), "--plot-heads"], input=LINES)
    assert per_head.exit_code == 0, per_head.output
    mean_image, heads_image = imread(mean / "attention_0003.png"), imread(heads / "attention_0003.png")
    assert heads_image.shape[1] > 2 * mean_image.shape[1]  # 4 head panels side by side


@pytest.mark.slow
def test_translate_writes_heatmaps_for_the_rnn(reverse_rnn_run, tmp_path):
    translator = Translator.load(reverse_rnn_run.run_path)
    best = translator.translate_nbest(["d e f g h"], Decoding(beam=1))[0][0]
    attention = attention_map(translator, "d e f g h", target=best.tokens)
    assert attention.weights.shape == (1, len(best.tokens) + 1, 6)
    torch.testing.assert_close(attention.weights.sum(-1), torch.ones(1, len(best.tokens) + 1))
    result = CliRunner().invoke(
        app, ["translate", "-m", str(reverse_rnn_run.run_path), "--plot-attention", str(tmp_path / "plots")], input=LINES
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [f"attention_000{n}.png" for n in (1, 3, 4)]
    assert imread(tmp_path / "plots/attention_0003.png").ndim == 3
