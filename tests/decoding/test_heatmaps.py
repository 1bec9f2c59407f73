"""Attention heatmaps without a trained model: titles name the model and its attention, and a model
without attention is refused before translating (trained maps: tests/integration/decoding/)."""

from __future__ import annotations

import dataclasses

from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.config import ModelConfig
from mtkit.data.tokenizer import load_tokenizers
from mtkit.decoding.heatmaps import model_label
from mtkit.models import build_model
from mtkit.models.checkpoint import checkpoint_payload, save_checkpoint


def test_heatmap_titles_name_the_model_and_its_attention():
    assert model_label(ModelConfig(arch="transformer")) == "Transformer, last decoder layer"
    assert model_label(ModelConfig(arch="rnn", cell="gru", attention="bahdanau")) == "RNN GRU, bahdanau attention"
    assert model_label(ModelConfig(arch="rnn", cell="lstm", attention="luong_general")) == "RNN LSTM, luong general attention"
    assert model_label(None) == "attention"  # a translator built in code, without its recipe


def test_a_model_without_attention_is_refused_before_translating(reverse_task, tmp_path):
    no_attention = ModelConfig(arch="rnn", cell="gru", layers=1, hidden_size=32, embed_dim=16, attention="none")
    config = dataclasses.replace(reverse_task, model=no_attention)
    tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    model = build_model(
        config.model, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=tokenizers.joint
    )
    checkpoint = tmp_path / "no_attention.pt"
    save_checkpoint(checkpoint_payload(config, tokenizers, weights=model.state_dict()), checkpoint)
    result = CliRunner().invoke(app, ["translate", "-m", str(checkpoint), "--plot-attention", str(tmp_path / "p")], input="a b\n")
    assert result.exit_code == 2
    assert "no attention" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "p").exists()
