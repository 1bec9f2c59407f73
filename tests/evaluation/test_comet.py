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
