"""mtkit's COMET scorer against unbabel-comet's own scores of tiny random checkpoints of each class
(tests/fixtures/comet/, made by make_comet_reference.py beside this file), and its one-line refusals."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest
import torch
import yaml

from mtkit.errors import MtkitError
from mtkit.evaluation.comet.checkpoint import find_checkpoint, read_state_dict
from mtkit.evaluation.comet.layers import sparsemax
from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.comet.scorer import CometScorer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "comet"
ENCODER = FIXTURES / "tiny-xlmr"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))


def scorer(name: str | Path, **options: object) -> CometScorer:
    return CometScorer.load(CometOptions(model=str(FIXTURES / name), encoder=ENCODER, device="cpu", **options))


@pytest.mark.parametrize("name", sorted(EXPECTED["models"]))
def test_scores_agree_with_unbabel_comet_per_sentence(name):
    comet = scorer(name, batch_size=4)  # other batches than unbabel-comet's (4 of its own order): padding must not matter
    references = EXPECTED["references"] if comet.needs_references else None
    found = comet.score(EXPECTED["sources"], EXPECTED["translations"], references=references)
    expected = EXPECTED["models"][name]["scores"]
    assert len(found) == len(expected)
    for ours, theirs in zip(found, expected, strict=True):
        assert abs(ours - theirs) < 1e-5


def test_the_classes_are_comet_and_comet_qe_and_the_signature_names_model_and_precision():
    assert scorer("regression").needs_references and not scorer("unified").needs_references
    assert not scorer("referenceless").needs_references
    signature = scorer("unified", precision="bf16").signature
    assert signature.startswith(f"model:{FIXTURES / 'unified'}|scorer:mtkit-") and signature.endswith("|precision:bf16")


def test_bf16_scores_follow_fp32():
    sentences = EXPECTED["sources"], EXPECTED["translations"]
    full, half = scorer("referenceless").score(*sentences), scorer("referenceless", precision="bf16").score(*sentences)
    assert max(abs(a - b) for a, b in zip(full, half, strict=True)) < 0.05


def test_sparsemax_zeroes_the_small_weights_and_sums_to_one():
    weights = sparsemax(torch.tensor([0.5, 2.0, -1.0, 1.8]))
    assert torch.allclose(weights, torch.tensor([0.0, 0.6, 0.0, 0.4]))


def test_a_reference_based_model_without_references_is_one_line():
    with pytest.raises(MtkitError, match="scores against references: give --ref"):
        scorer("regression").score(["a"], ["b"])


def test_a_missing_or_wrong_folder_is_one_line(tmp_path):
    with pytest.raises(MtkitError, match="no such folder"):
        find_checkpoint(str(tmp_path / "nowhere"))
    with pytest.raises(MtkitError, match="not a COMET folder; it needs hparams.yaml and checkpoints/model.ckpt"):
        find_checkpoint(str(ENCODER))
    folder = shutil.copytree(FIXTURES / "regression", tmp_path / "other")
    (folder / "hparams.yaml").write_text(yaml.safe_dump({"class_identifier": "xcomet_metric"}), encoding="utf-8")
    with pytest.raises(MtkitError, match="class_identifier 'xcomet_metric' is not one mtkit scores with"):
        find_checkpoint(str(folder))


def test_offline_a_hub_id_or_an_encoder_not_in_the_cache_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(MtkitError, match="Unbabel/wmt22-comet-da: not found locally and not downloadable"):
        find_checkpoint("Unbabel/wmt22-comet-da")
    folder = shutil.copytree(FIXTURES / "unified", tmp_path / "kiwi")
    hparams = yaml.safe_load((folder / "hparams.yaml").read_text(encoding="utf-8")) | {
        "pretrained_model": "microsoft/infoxlm-large"
    }
    (folder / "hparams.yaml").write_text(yaml.safe_dump(hparams), encoding="utf-8")
    with pytest.raises(MtkitError, match="encoder microsoft/infoxlm-large's config .* give --comet-encoder DIR"):
        CometScorer.load(CometOptions(model=str(folder), device="cpu"))


def test_a_hub_id_is_fetched_by_huggingface_hub_and_scored_like_the_folder(tmp_path, monkeypatch):
    asked = []

    def download(repo_id: str, allow_patterns: list[str]) -> str:  # the hub, offline: the fixture's folder
        asked.append((repo_id, allow_patterns))
        return str(shutil.copytree(FIXTURES / "unified", tmp_path / "snapshot"))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    comet = CometScorer.load(CometOptions(model="Unbabel/tiny-kiwi", encoder=ENCODER, device="cpu"))
    assert asked == [("Unbabel/tiny-kiwi", ["hparams.yaml", "checkpoints/model.ckpt"])]
    assert comet.signature.startswith("model:Unbabel/tiny-kiwi|")
    found = comet.score(EXPECTED["sources"], EXPECTED["translations"])
    assert max(abs(a - b) for a, b in zip(found, EXPECTED["models"]["unified"]["scores"], strict=True)) < 1e-5


def test_a_checkpoint_that_unpickles_objects_is_refused_and_lightnings_dicts_are_read(tmp_path, monkeypatch):
    weights = {"state_dict": {"w": torch.ones(2)}}
    names = ["pytorch_lightning", "pytorch_lightning.utilities", "pytorch_lightning.utilities.parsing"]
    with monkeypatch.context() as patch:  # lightning's class, pickled as lightning pickles it; read without lightning
        for name in names:
            patch.setitem(sys.modules, name, types.ModuleType(name))
        attribute_dict = type("AttributeDict", (dict,), {"__module__": names[-1]})
        sys.modules[names[-1]].AttributeDict = attribute_dict
        torch.save(weights | {"hyper_parameters": attribute_dict(pool="avg")}, tmp_path / "lightning.ckpt")
    assert torch.equal(read_state_dict(tmp_path / "lightning.ckpt")["w"], torch.ones(2))
    torch.save(weights | {"extra": types.SimpleNamespace(code="anything")}, tmp_path / "object.ckpt")
    with pytest.raises(MtkitError, match="refused: reading it would unpickle types.SimpleNamespace"):
        read_state_dict(tmp_path / "object.ckpt")


def test_an_encoder_of_another_shape_is_one_line(tmp_path):
    encoder = shutil.copytree(ENCODER, tmp_path / "encoder")
    config = json.loads((encoder / "config.json").read_text(encoding="utf-8")) | {"hidden_size": 16}
    (encoder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(MtkitError, match="check --comet-encoder names the encoder the model was trained on"):
        CometScorer.load(CometOptions(model=str(FIXTURES / "regression"), encoder=encoder, device="cpu"))


def test_an_integer_past_python_s_limit_in_hparams_is_one_line(tmp_path):
    folder = shutil.copytree(FIXTURES / "referenceless", tmp_path / "digits")
    text = (folder / "hparams.yaml").read_text(encoding="utf-8").replace("- 16\n", f"- {'1' * 5000}\n")
    (folder / "hparams.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(MtkitError, match=r"hparams.yaml: not readable YAML \(a value YAML cannot build: Exceeds") as caught:
        find_checkpoint(str(folder))
    assert "\n" not in str(caught.value)


def with_hparams(tmp_path: Path, name: str, **changes: object) -> Path:
    """A copy of a fixture COMET folder whose hparams.yaml has `changes`."""
    folder = shutil.copytree(FIXTURES / name, tmp_path / name)
    hparams = yaml.safe_load((folder / "hparams.yaml").read_text(encoding="utf-8")) | changes
    (folder / "hparams.yaml").write_text(yaml.safe_dump(hparams), encoding="utf-8")
    return folder


def with_encoder(tmp_path: Path, **changes: object) -> Path:
    """A copy of the tiny encoder folder whose config.json has `changes`."""
    encoder = shutil.copytree(ENCODER, tmp_path / "encoder")
    config = json.loads((encoder / "config.json").read_text(encoding="utf-8")) | changes
    (encoder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return encoder


@pytest.mark.parametrize(
    "name, changes, message",
    [
        ("referenceless", {"hidden_sizes": 3072}, "hidden_sizes 3072: give the estimator's layer widths as a list of 1"),
        ("referenceless", {"hidden_sizes": []}, r"hidden_sizes \[\]: give the estimator's layer widths"),
        ("referenceless", {"hidden_sizes": [16, 10**30]}, r"hidden_sizes \[16, 10+\]: .* whole numbers from 1 to 1048576"),
        ("referenceless", {"activations": 5}, "activations 5 is not an activation mtkit builds; give one of Tanh, Sigmoid"),
        ("referenceless", {"activations": "Transformer"}, "activations 'Transformer' is not an activation mtkit builds"),
        ("regression", {"final_activation": "threshold"}, r"final_activation 'threshold' .* \(or null for none\)"),
        ("regression", {"pool": "mean"}, "pool 'mean': give one of avg, max, cls, default"),
        ("unified", {"input_segments": "mt"}, r"input_segments 'mt': give one of \['mt', 'src'\]"),
    ],
    ids=["a-number", "empty", "too-wide", "activation-number", "not-an-activation", "final", "pool", "segments"],
)
def test_malformed_hparams_are_one_line_naming_the_file_key_and_value(tmp_path, name, changes, message):
    folder = with_hparams(tmp_path, name, **changes)
    with pytest.raises(MtkitError, match=message) as caught:
        find_checkpoint(str(folder))
    assert str(caught.value).startswith(f"{folder / 'hparams.yaml'}: ") and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "name, changes, message",
    [
        ("referenceless", {"layer": 99}, "layer 99: give mix or one of the encoder's layers, 0 .its embeddings. to 2"),
        ("referenceless", {"layer": "last"}, "layer 'last': give mix or one of the encoder's layers"),
        ("unified", {"sent_layer": -1}, "sent_layer -1: give mix or one of the encoder's layers"),
        (
            "referenceless",
            {"hidden_sizes": [1000000, 1000000]},
            r"its checkpoint has estimator.ff.0.weight of shape \(16, 128\), unlike hidden_sizes \[1000000, 1000000\]",
        ),
        (
            "regression",
            {"hidden_sizes": [16, 8, 4]},
            r"has estimator.ff.6.weight of shape \(1, 8\), unlike hidden_sizes \[16, 8, 4\]",
        ),
    ],
    ids=["layer-99", "layer-name", "sent-layer", "a-million-wide", "one-layer-more"],
)
def test_hparams_that_do_not_fit_the_encoder_or_the_checkpoint_are_one_line_before_anything_is_allocated(
    tmp_path, name, changes, message
):
    """The widths are compared with the checkpoint's shapes on the meta device: a million-wide layer is a line, not a
    4 TB allocation."""
    folder = with_hparams(tmp_path, name, **changes)
    with pytest.raises(MtkitError, match=message) as caught:
        CometScorer.load(CometOptions(model=str(folder), encoder=ENCODER, device="cpu"))
    assert str(caught.value).startswith(f"{folder / 'hparams.yaml'}: ") and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_hidden_layers": 10**9}, "config.json: num_hidden_layers 1000000000: an XLM-R encoder has 1 to 128"),
        ({"num_hidden_layers": 0}, "config.json: num_hidden_layers 0: an XLM-R encoder has 1 to 128"),
        ({"num_attention_heads": 3}, r"config.json: does not describe an XLM-R encoder \(The hidden size \(32\) is not a"),
        ({"vocab_size": 10**12}, r"its checkpoint has encoder.embeddings.word_embeddings.weight of shape \(252, 32\)"),
        ({"hidden_size": 2**40, "num_attention_heads": 1}, r"config.json: does not describe an XLM-R encoder \(Storage size"),
    ],
    ids=["deep", "no-layers", "heads", "vocabulary", "width"],
)
def test_an_encoder_config_that_does_not_fit_the_checkpoint_is_one_line_before_anything_is_allocated(tmp_path, changes, message):
    encoder = with_encoder(tmp_path, **changes)
    with pytest.raises(MtkitError, match=message) as caught:
        CometScorer.load(CometOptions(model=str(FIXTURES / "referenceless"), encoder=encoder, device="cpu"))
    assert "\n" not in str(caught.value)


def test_no_sentences_are_no_scores():
    assert scorer("referenceless").score([], []) == []
