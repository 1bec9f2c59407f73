"""Run by benchmarks/comet_speed.py inside unbabel-comet's own environment (it pins transformers < 5):

    python benchmarks/comet_build.py build FOLDER HIDDEN LAYERS HEADS FFN VOCAB
    python benchmarks/comet_build.py score FOLDER SOURCES.json THREADS WORKDIR

`build` writes a COMET folder of a RegressionMetric (wmt22-comet-da's class and estimator sizes) over a random
XLM-R encoder of the given shape, with the tests' tiny SentencePiece tokenizer (tests/fixtures/comet/tiny-xlmr;
the vocabulary's size is VOCAB all the same, so the embedding table is the real one's). `score` loads it as a user
loads a published checkpoint, scores the pairs once to warm up and once timed, and prints the seconds as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
import yaml
from comet import load_from_checkpoint
from comet.models import RegressionMetric
from transformers import XLMRobertaConfig, XLMRobertaTokenizerFast

TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "comet" / "tiny-xlmr"


def build(folder: Path, hidden: int, layers: int, heads: int, ffn: int, vocab: int) -> None:
    encoder = folder / "encoder"
    encoder.mkdir(parents=True)
    XLMRobertaTokenizerFast.from_pretrained(TOKENIZER).save_pretrained(encoder)
    config = XLMRobertaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                              intermediate_size=ffn, max_position_embeddings=514)  # fmt: skip
    config.save_pretrained(encoder)
    os.chdir(folder)  # unbabel-comet finds a relative pretrained_model from the working directory
    torch.manual_seed(0)
    model = RegressionMetric(pretrained_model="encoder", load_pretrained_weights=False, hidden_sizes=[3072, 1024],
                             layer_transformation="sparsemax", pool="avg")  # fmt: skip
    (folder / "checkpoints").mkdir()
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu")
    trainer.strategy.connect(model)
    trainer.save_checkpoint(folder / "checkpoints" / "model.ckpt")
    hparams = {key: value for key, value in dict(model.hparams).items() if key != "load_pretrained_weights"}
    (folder / "hparams.yaml").write_text(yaml.safe_dump(hparams), encoding="utf-8")


def score(folder: Path, pairs: Path, threads: int, workdir: Path) -> None:
    torch.set_num_threads(threads)
    os.chdir(workdir)  # where the hparams' relative pretrained_model is
    model = load_from_checkpoint(str(folder / "checkpoints" / "model.ckpt"))
    rows = json.loads(pairs.read_text(encoding="utf-8"))
    samples = [{"src": s, "mt": t, "ref": r} for s, t, r in zip(rows["src"], rows["mt"], rows["ref"], strict=True)]
    model.predict(samples[:16], batch_size=16, gpus=0, progress_bar=False)  # warm-up
    start = time.perf_counter()
    output = model.predict(samples, batch_size=16, gpus=0, progress_bar=False)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "system_score": float(output.system_score)}))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        target = Path(sys.argv[2]).resolve()
        shutil.rmtree(target, ignore_errors=True)
        build(target, *map(int, sys.argv[3:8]))
    else:
        score(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve(), int(sys.argv[4]), Path(sys.argv[5]).resolve())
