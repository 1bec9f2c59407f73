"""Make the tiny COMET checkpoints in tests/fixtures/comet/ and score them with unbabel-comet itself.

tests/evaluation/test_comet.py checks that mtkit's scorer gives the scores written here. unbabel-comet
pins transformers < 5, numpy < 2 and protobuf < 5, so it runs in an environment of its own; from the
repository root (with ../shared/data/multi30k beside it):

    python3.11 -m venv /work/venvs/comet
    /work/venvs/comet/bin/pip install torch==2.13.0
    /work/venvs/comet/bin/pip install unbabel-comet==2.2.7 sentencepiece==0.2.0 "setuptools<81"
    /work/venvs/comet/bin/python tests/evaluation/make_comet_reference.py

It writes, under tests/fixtures/comet/: tiny-xlmr/ (a 2-layer XLM-R encoder's config and a SentencePiece
tokenizer of a few hundred pieces, trained on Multi30k lines), one COMET folder per class
(checkpoints/model.ckpt and hparams.yaml, saved by pytorch-lightning as COMET saves its own), and
expected.json (the sentences and unbabel-comet's score for each, per folder). The weights are random:
the folders test the computation, not quality.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytorch_lightning as pl
import sentencepiece as spm
import torch
import yaml
from comet import load_from_checkpoint
from comet.models import ReferencelessRegression, RegressionMetric, UnifiedMetric
from transformers import XLMRobertaConfig, XLMRobertaTokenizerFast

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "comet"
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
ENCODER = "tiny-xlmr"  # the hparams' pretrained_model, a folder unbabel-comet finds from OUT (its working directory)

SOURCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee auf einer großen Wiese neben einem alten Haus.",
    "Kinder lachen.",
    "Eine Frau in einem roten Kleid singt auf einer Bühne vor vielen Menschen, die tanzen und klatschen.",
    "Ein Junge springt ins Wasser.",
    "Leute warten an der Bushaltestelle.",
]
TRANSLATIONS = [
    "A man rides a bike.",
    "Two dogs play in the snow on a big meadow next to an old house.",
    "Children laugh loudly in the park.",
    "A woman in a red dress is singing on stage.",
    "A boy jumps.",
    "People wait at the bus stop.",
]
REFERENCES = [
    "A man is riding a bicycle.",
    "Two dogs are playing in the snow on a large meadow beside an old house.",
    "Children are laughing.",
    "A woman in a red dress sings on a stage in front of many people who dance and clap.",
    "A boy jumps into the water.",
    "People are waiting at the bus stop.",
]

COMMON = {
    "pretrained_model": ENCODER,
    "load_pretrained_weights": False,
    "hidden_sizes": [16, 8],
    "dropout": 0.1,
    "nr_frozen_epochs": 0.3,
}
# One folder per class, each with another layer mix, pooling or input so every branch is checked.
MODELS = {
    "regression": (RegressionMetric, {"layer_transformation": "sparsemax", "layer_norm": False, "pool": "avg"}),
    "regression-layernorm": (RegressionMetric, {"layer_transformation": "softmax", "layer_norm": True, "pool": "avg"}),
    "unified": (
        UnifiedMetric,
        {"layer_transformation": "sparsemax", "layer_norm": False, "input_segments": ["mt", "src"], "word_layer": 2},
    ),
    "referenceless": (ReferencelessRegression, {"layer_transformation": "softmax", "layer_norm": True, "pool": "avg"}),
}


def train_tokenizer(folder: Path) -> XLMRobertaTokenizerFast:
    """A SentencePiece model of 250 pieces on 400 German and English lines, wrapped as XLM-R's tokenizer."""
    lines = []
    for lang in ("de", "en"):
        with gzip.open(MULTI30K / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines += [next(f).strip() for _ in range(200)]
    text = folder / "lines.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prefix = folder / "spm"
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(prefix), vocab_size=250, model_type="unigram", character_coverage=1.0
    )
    tokenizer = XLMRobertaTokenizerFast(vocab_file=str(prefix) + ".model")
    for path in (text, prefix.with_suffix(".model"), prefix.with_suffix(".vocab")):
        path.unlink()
    return tokenizer


def write_encoder(folder: Path) -> None:
    """The encoder folder that hparams' pretrained_model names: config.json and the tokenizer."""
    folder.mkdir(parents=True)
    tokenizer = train_tokenizer(folder)
    tokenizer.save_pretrained(folder)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=66,  # 64 tokens: long inputs are truncated, as at 512 in the real ones
    )
    config.save_pretrained(folder)


def randomise(model: torch.nn.Module) -> None:
    """Weights far from their initial values, so the layer mix and the estimator shape every score."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "scalar_parameters" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
            elif "LayerNorm" not in name:
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))


def save_folder(name: str, model: pl.LightningModule) -> None:
    """checkpoints/model.ckpt through pytorch-lightning, and hparams.yaml, as COMET's training writes them."""
    folder = OUT / name
    (folder / "checkpoints").mkdir(parents=True)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu")
    trainer.strategy.connect(model)
    trainer.save_checkpoint(folder / "checkpoints" / "model.ckpt")
    hparams = {key: value for key, value in dict(model.hparams).items() if key != "load_pretrained_weights"}
    (folder / "hparams.yaml").write_text(yaml.safe_dump(hparams), encoding="utf-8")


def score(name: str) -> dict:
    """unbabel-comet's scores of the folder, loaded as a user loads a published checkpoint."""
    model = load_from_checkpoint(str(Path(name) / "checkpoints" / "model.ckpt"))
    samples = [
        {"src": s, "mt": t, **({"ref": r} if model.requires_references() else {})}
        for s, t, r in zip(SOURCES, TRANSLATIONS, REFERENCES, strict=True)
    ]
    output = model.predict(samples, batch_size=4, gpus=0, progress_bar=False)
    return {"scores": [float(x) for x in output.scores], "system_score": float(output.system_score)}


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    write_encoder(OUT / ENCODER)
    os.chdir(OUT)  # unbabel-comet resolves a relative pretrained_model against the working directory
    for name, (cls, options) in MODELS.items():
        torch.manual_seed(0)
        model = cls(**COMMON, **options)
        randomise(model)
        save_folder(name, model)
    expected = {
        "sources": SOURCES,
        "translations": TRANSLATIONS,
        "references": REFERENCES,
        "comet": "unbabel-comet 2.2.7",
        "models": {name: score(name) for name in MODELS},
    }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
