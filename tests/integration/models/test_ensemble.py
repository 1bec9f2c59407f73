"""Ensembles: several models behind the one contract, their log-probabilities averaged at every step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import cli_output, write_text_lines
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError


def test_an_ensemble_of_a_model_with_itself_gives_its_outputs_and_scores(model_run, model_translator, model_valid):
    ensemble = Translator.load([model_run.run_path, model_run.run_path], device="cpu")
    sources, targets = model_valid[0][:15], model_valid[1][:15]
    for beam in (1, 3):
        alone, both = (
            model_translator.translate_nbest(sources, Decoding(beam=beam)),
            ensemble.translate_nbest(sources, Decoding(beam=beam)),
        )
        assert [t[0].tokens for t in both] == [t[0].tokens for t in alone]
        assert [t[0].score for t in both] == pytest.approx([t[0].score for t in alone], abs=1e-4)
    assert [s.log_prob for s in ensemble.score(sources, targets)] == pytest.approx(
        [s.log_prob for s in model_translator.score(sources, targets)], abs=1e-4
    )


def test_a_transformer_and_an_rnn_ensemble_through_the_cli(reverse_run, reverse_rnn_run, tmp_path):
    raw = reverse_run.data_path.parent / "raw"
    sources, targets = (raw / "valid.src").read_text().splitlines()[:20], (raw / "valid.tgt").read_text().splitlines()[:20]
    source = write_text_lines(tmp_path / "src", sources)
    models = ["-m", reverse_run.run_path, "-m", reverse_rnn_run.run_path]
    lines = cli_output("translate", *models, "-i", source).splitlines()
    assert sum(line == target for line, target in zip(lines, targets, strict=True)) >= 18
    assert (
        len(cli_output("score", *models, "--src", source, "--tgt", write_text_lines(tmp_path / "tgt", targets)).splitlines())
        == 20
    )
    result = json.loads(cli_output("evaluate", *models, "--src", source, "--ref", tmp_path / "tgt", "--json"))
    assert result["scores"]["BLEU"]["score"] > 80


def test_an_ensemble_of_models_with_other_vocabularies_is_one_clear_error(reverse_run, tmp_path):
    from mtkit.data.tokenizer import TokenizerPair, load_tokenizers, train_sentencepiece
    from mtkit.models.ensemble import check_same_vocabularies

    pair = load_tokenizers(reverse_run.data_path, joint=reverse_run.tokenizer.joint)
    other_words = ["m n o p q r s t u v w x y z", "mn op qr st uv wx yz"] * 50  # not the task's letters
    other = TokenizerPair.of(pair.src, train_sentencepiece(other_words, 30))
    check_same_vocabularies([Path("a"), Path("b")], [pair, pair])  # the same vocabularies pass
    with pytest.raises(MtkitError, match="b: its target vocabulary differs from a's"):
        check_same_vocabularies([Path("a"), Path("b")], [pair, other])


def test_an_ensemble_with_an_export_names_the_pytorch_engine(reverse_run, tmp_path):
    from mtkit.exporters.ctranslate2 import export_ctranslate2

    exported = export_ctranslate2(reverse_run.run_path, tmp_path / "export", quantization=None)
    source = write_text_lines(tmp_path / "src", ["a b c"])
    result = CliRunner().invoke(app, ["translate", "-m", str(reverse_run.run_path), "-m", str(exported), "-i", str(source)])
    assert result.exit_code == 2 and "ensembles need the PyTorch engine" in result.output
