"""Word alignments from cross-attention: anti-diagonal on the reverse task, Pharaoh pairs in the CLI output."""

from __future__ import annotations

from helpers import cli_output, write_text_lines
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.decoding.options import Decoding


def test_alignments_on_the_reverse_task_are_anti_diagonal(model_translator, model_valid):
    sources = model_valid[0][:30]
    found = model_translator.translate_nbest(sources, Decoding(beam=2, alignments=True))
    on_diagonal = total = 0
    for source, [best] in zip(sources, found, strict=True):
        words = len(source.split())
        assert best.alignment and all(0 <= i < words and 0 <= j < len(best.text.split()) for i, j in best.alignment)
        on_diagonal += sum(i == words - 1 - j for i, j in best.alignment)
        total += len(best.alignment)
    assert on_diagonal >= 0.9 * total


def test_alignments_cli_appends_pharaoh_pairs_after_a_tab(model_run, model_valid, tmp_path):
    source = write_text_lines(tmp_path / "src", model_valid[0][:5] + [""])
    lines = cli_output("translate", "-m", model_run.run_path, "-i", source, "--alignments").splitlines()
    assert len(lines) == 6 and lines[5] == "\t"
    for line, text in zip(lines, model_valid[0][:5], strict=False):
        translation, pairs = line.split("\t")
        assert translation == " ".join(reversed(text.split()))
        assert all(pair.count("-") == 1 and all(part.isdigit() for part in pair.split("-")) for pair in pairs.split())
    layer = CliRunner().invoke(
        app, ["translate", "-m", str(model_run.run_path), "-i", str(source), "--alignments", "--alignment-layer", "7"]
    )
    assert layer.exit_code == 2 and "--alignment-layer 7" in layer.output
