"""`mtkit export` to CTranslate2: every weight lands where CTranslate2 reads it, and the exported
model translates like the PyTorch engine (same outputs, scores, n-best lists, segments and caps)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import json
from pathlib import Path

import pytest
import torch
from helpers import prepared_reverse_task, reversal_margin, reverse, trained_past_the_edge
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.config import Config, ModelConfig
from mtkit.data.tokenizer import BOS_ID, EOS_ID, load_tokenizers
from mtkit.decoding.ct2_engine import MANIFEST, CT2Engine, load_export
from mtkit.decoding.engine import Capability, PyTorchEngine, length_batches
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.exporters.ctranslate2 import export_ctranslate2
from mtkit.models import build_model
from mtkit.models.checkpoint import checkpoint_payload, save_checkpoint

EXTRA_LINES = ["", "a b c", "   ", "l k j i h g f e d c b a", "a\u0301 b", "g"]


@pytest.fixture
def sources(reverse_run) -> list[str]:
    valid = (reverse_run.data_path.parent / "raw/valid.src").read_text(encoding="utf-8").splitlines()
    return valid + EXTRA_LINES


def with_decode(translator, **changes):
    """The same engine with other decoding settings (both engines keep them in `.decode`)."""
    changed = copy.copy(translator)
    changed.decode = dataclasses.replace(translator.decode, **changes)
    return changed


@pytest.mark.parametrize("beam", [1, 4])
def test_float32_export_translates_exactly_like_pytorch(reverse_pytorch, reverse_ct2, sources, beam):
    expected = reverse_pytorch.translate_nbest(sources, Decoding(beam=beam))
    found = reverse_ct2.translate_nbest(sources, Decoding(beam=beam))
    assert [best[0].text for best in found] == [best[0].text for best in expected]
    assert [best[0].tokens for best in found] == [best[0].tokens for best in expected]
    for mine, theirs in zip(found, expected, strict=True):
        assert mine[0].score == pytest.approx(theirs[0].score, abs=1e-4)
    assert found[len(sources) - len(EXTRA_LINES)][0].text == ""  # the empty line
    assert found[-5][0].text == "c b a"


def test_nbest_returns_the_same_ranked_hypotheses_as_pytorch(reverse_pytorch, reverse_ct2):
    lines = ["a b c d", "e f", "", "k l a b c"]
    expected = reverse_pytorch.translate_nbest(lines, Decoding(beam=4, nbest=3, length_penalty=0.6))
    found = reverse_ct2.translate_nbest(lines, Decoding(beam=4, nbest=3, length_penalty=0.6))
    assert [len(best) for best in found] == [3, 3, 3, 3]
    for hypotheses, theirs in zip(found, expected, strict=True):
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert [h.text for h in hypotheses] == [h.text for h in theirs]
        assert scores == pytest.approx([h.score for h in theirs], abs=1e-4)
    assert len({tuple(h.tokens) for h in found[0]}) == 3


def test_over_long_lines_are_split_into_the_same_segments(reverse_pytorch, reverse_ct2):
    letters = " ".join("abcdefghijkl" * 2)
    lines = [letters, "a b", f"{letters} . {letters}"]
    short_pytorch, short_exported = with_decode(reverse_pytorch, max_input_tokens=8), with_decode(reverse_ct2, max_input_tokens=8)
    expected = short_pytorch.translate_nbest(lines, Decoding(beam=2, nbest=2))
    found = short_exported.translate_nbest(lines, Decoding(beam=2, nbest=2))
    assert [[h.text for h in best] for best in found] == [[h.text for h in best] for best in expected]
    assert short_exported.plan(lines).split_lines == short_pytorch.plan(lines).split_lines == 2


def test_greedy_output_at_the_length_cap_matches_pytorch(reverse_pytorch, reverse_ct2):
    lines = ["a b c d e f g", "a b", "l k j i"]
    capped_pytorch, capped_exported = (
        with_decode(reverse_pytorch, max_len_a=0.0, max_len_b=2),
        with_decode(reverse_ct2, max_len_a=0.0, max_len_b=2),
    )
    expected = capped_pytorch.translate_nbest(lines, Decoding(beam=1))
    found = capped_exported.translate_nbest(lines, Decoding(beam=1))
    assert [best[0].tokens for best in found] == [best[0].tokens for best in expected]
    # The forced EOS after the cap is part of the score in both engines.
    assert [best[0].score for best in found] == pytest.approx([best[0].score for best in expected], abs=1e-4)
    for hypothesis in capped_exported.translate_nbest(lines, Decoding(beam=3, nbest=3))[0]:
        assert len(hypothesis.tokens) <= 2


def test_a_fixed_cap_decodes_every_length_in_one_call_like_pytorch(reverse_pytorch, reverse_ct2, sources, monkeypatch):
    fixed_pytorch, fixed_exported = (
        with_decode(reverse_pytorch, max_len_a=0.0, max_len_b=100),
        with_decode(reverse_ct2, max_len_a=0.0, max_len_b=100),
    )
    calls = []
    search = CT2Engine._translate

    def counted(self, batch, *rest):
        calls.append(len(batch))
        return search(self, batch, *rest)

    monkeypatch.setattr(CT2Engine, "_translate", counted)
    found = fixed_exported.translate_nbest(sources, Decoding(beam=4))
    expected = fixed_pytorch.translate_nbest(sources, Decoding(beam=4))
    assert [best[0].tokens for best in found] == [best[0].tokens for best in expected]
    # One call per batch of the pipeline: every length shares the cap.
    lengths = [len(segments[0]) for segments in map(fixed_exported.segments, sources) if segments]
    assert calls == [len(batch) for batch in length_batches(lengths, 4, batch_tokens=fixed_exported.decode.batch_beam_tokens)]
    assert len({len(line.split()) for line in sources}) > 3


def test_int8_export_is_smaller_and_agrees_with_float32(reverse_run, reverse_export, reverse_ct2, sources, tmp_path):
    int8_dir = export_ctranslate2(reverse_run.run_path, tmp_path / "int8", quantization="int8")
    assert (int8_dir / "model.bin").stat().st_size < 0.7 * (reverse_export / "model.bin").stat().st_size
    assert json.loads((int8_dir / MANIFEST).read_text())["quantization"] == "int8"
    int8 = Translator.over(load_export(int8_dir, threads=1))
    quantized, reference = int8.translate(sources, beam=1), reverse_ct2.translate(sources, beam=1)
    assert len(quantized) == len(sources)
    assert sum(q == r for q, r in zip(quantized, reference, strict=True)) >= 0.9 * len(sources)


@pytest.mark.parametrize(
    ("norm", "positions", "tie"), list(itertools.product(["pre", "post"], ["sinusoidal", "learned"], [True, False]))
)
def test_every_weight_is_mapped_for_each_architecture_option(reverse_run, tmp_path, norm, positions, tie):
    """Teacher-forced log-probabilities of a randomly perturbed model agree token by token."""
    model_config = dataclasses.replace(reverse_run.model, norm=norm, positions=positions, tie_embeddings=tie, max_positions=40)
    config = dataclasses.replace(reverse_run, model=model_config)
    tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    torch.manual_seed(0)
    model = build_model(
        config.model, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=tokenizers.joint
    ).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))  # no weight keeps its (often zero or one) initial value
    checkpoint = tmp_path / "model.pt"
    save_checkpoint(checkpoint_payload(config, tokenizers, weights=model.state_dict()), checkpoint)
    translator = Translator.over(load_export(export_ctranslate2(checkpoint, tmp_path / "exported", quantization=None), threads=1))
    for source, target in [("a b c d", "d c b a"), ("l k j i h g f", "f g h i j k l l"), ("e", "")]:
        source_ids, target_ids = tokenizers.src.encode(source) + [EOS_ID], tokenizers.tgt.encode(target)
        with torch.no_grad():
            src = torch.tensor([source_ids])
            memory = model.encode(src, src.ne(0))
            logits, _ = model.decode(torch.tensor([[BOS_ID, *target_ids]]), memory, src_mask=src.ne(0))
        expected = torch.log_softmax(logits[0], dim=-1)[torch.arange(len(target_ids) + 1), target_ids + [EOS_ID]]
        scored = translator.engine.model.score_batch(
            [tokenizers.src.id_to_piece(source_ids[:-1])], [tokenizers.tgt.id_to_piece(target_ids)]
        )
        torch.testing.assert_close(torch.tensor(scored[0].log_probs), expected, atol=2e-4, rtol=0)


def test_an_rnn_checkpoint_is_refused_with_the_reason(reverse_run, tmp_path):
    config = dataclasses.replace(reverse_run, model=ModelConfig(arch="rnn", cell="gru", layers=1, hidden_size=32, embed_dim=16))
    tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    model = build_model(
        config.model, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=tokenizers.joint
    )
    checkpoint = tmp_path / "rnn.pt"
    save_checkpoint(checkpoint_payload(config, tokenizers, weights=model.state_dict()), checkpoint)
    with pytest.raises(MtkitError, match=r"RNN models are not supported by CTranslate2; translate with the PyTorch engine"):
        export_ctranslate2(checkpoint, tmp_path / "out", quantization=None)
    assert not (tmp_path / "out").exists()
    result = CliRunner().invoke(app, ["export", "-m", str(checkpoint), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "mtkit translate -m" in result.stderr


def test_a_non_empty_output_directory_needs_force_and_is_never_cleared_of_other_files(reverse_run, tmp_path):
    target = export_ctranslate2(reverse_run.run_path, tmp_path / "out", quantization=None)
    with pytest.raises(MtkitError, match="--force"):
        export_ctranslate2(reverse_run.run_path, target, quantization="int8")
    export_ctranslate2(reverse_run.run_path, target, quantization="int8", force=True)
    assert json.loads((target / MANIFEST).read_text())["quantization"] == "int8"
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(MtkitError, match="not an mtkit export"):
        export_ctranslate2(reverse_run.run_path, other, quantization=None, force=True)
    assert (other / "keep.txt").read_text() == "mine"
    with pytest.raises(MtkitError, match="--quantization"):
        export_ctranslate2(reverse_run.run_path, tmp_path / "bad", quantization="int3")


def test_engines_are_chosen_by_what_the_path_holds(reverse_run, reverse_export):
    assert isinstance(Translator.load(reverse_export).engine, CT2Engine)
    assert isinstance(Translator.load(reverse_run.run_path, device="cpu").engine, PyTorchEngine)
    with pytest.raises(MtkitError, match="--engine ctranslate2"):
        Translator.load(reverse_export, engine="pytorch")
    with pytest.raises(MtkitError, match="not a CTranslate2 export"):
        Translator.load(reverse_run.run_path, engine="ctranslate2")


def test_a_feature_the_engine_lacks_is_one_error_naming_the_engine_and_the_alternative(reverse_ct2, reverse_export, tmp_path):
    with pytest.raises(MtkitError, match=r"^--plot-attention needs attention weights, which the ctranslate2 engine lacks; use"):
        reverse_ct2.require(Capability.ATTENTION, "--plot-attention")
    source = tmp_path / "in.txt"
    source.write_text("a b c\n", encoding="utf-8")
    arguments = ["translate", "-m", str(reverse_export), "-i", str(source), "--plot-attention", str(tmp_path / "plots")]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "ctranslate2 engine lacks" in result.stderr and "mtkit translate -m" in result.stderr
    assert not (tmp_path / "plots").exists()


def marian_shaped_run(directory: Path) -> Config:
    """Swish, sinusoids in halves, post-norm, an output bias and 1 encoder + 2 decoder layers, trained on the reverse
    task past the edge of learning, greedily (its test) and at beam 5 (decayed to zero and validated once at the end,
    so best.pt is the settled model; beam 5 as in `tagged_task_config`, where two early EOS cannot end the search)."""
    from mtkit.training.trainer import train

    def train_with_seed(seed: int) -> Config:
        schedule = {"schedule": "linear", "max_steps": 600, "validate_every": 600}
        config = prepared_reverse_task(directory / f"seed{seed}", batch_tokens=1600, lr=0.002, seed=seed, **schedule)
        layout = {"positions": "sinusoidal_halves", "norm": "post", "encoder_layers": 1, "decoder_layers": 2}
        config.model = dataclasses.replace(config.model, activation="swish", output_bias=True, **layout)
        config.decode = dataclasses.replace(config.decode, beam=5)
        train(config)
        return config

    return trained_past_the_edge(train_with_seed, functools.partial(reversal_margin, beams=(1,)))


@pytest.mark.slow
def test_a_marian_shaped_model_exports_and_translates_like_pytorch(tmp_path, sources):
    """The Marian-shaped model's greedy outputs and scores are the same in CTranslate2 as in PyTorch, and are the
    reversals (the fixture checked its margin over these lines)."""
    config = marian_shaped_run(tmp_path)
    pytorch = Translator.load(config.run_path, device="cpu")
    exported = Translator.over(
        load_export(export_ctranslate2(config.run_path, tmp_path / "exported", quantization=None), threads=1)
    )
    assert json.loads((tmp_path / "exported" / MANIFEST).read_text())["alignment_layer"] == 1
    lines = (config.data_path.parent / "raw/valid.src").read_text(encoding="utf-8").splitlines()[:40]
    expected = pytorch.translate_nbest(lines, Decoding(beam=1))
    found = exported.translate_nbest(lines, Decoding(beam=1))
    assert [best[0].text for best in found] == [best[0].text for best in expected] == [reverse(line) for line in lines]
    for mine, theirs in zip(found, expected, strict=True):
        assert mine[0].score == pytest.approx(theirs[0].score, abs=1e-4)


def test_an_imported_marian_model_exports_and_decodes_like_pytorch(tmp_path):
    """A tiny random Hugging Face Marian model, imported then exported: CTranslate2's greedy output is PyTorch's."""
    pytest.importorskip("transformers")
    from marian_builder import Variant, build_marian

    from mtkit.importers.marian import import_marian

    build_marian(tmp_path / "marian", Variant(separate=True))
    import_marian(str(tmp_path / "marian"), tmp_path / "run")
    pytorch = Translator.load(tmp_path / "run", device="cpu")
    exported = Translator.over(
        load_export(export_ctranslate2(tmp_path / "run", tmp_path / "exported", quantization=None), threads=1)
    )
    lines = ["A man rides a bike.", "Two dogs play in the snow while a child watches them.", "Children!", ""]
    expected = pytorch.translate_nbest(lines, Decoding(beam=1))
    found = exported.translate_nbest(lines, Decoding(beam=1))
    assert [[t.tokens for t in best] for best in found] == [[t.tokens for t in best] for best in expected]
    assert any(best and best[0].tokens for best in expected)
