"""train.validate_metric qe end to end: a tiny model trained a few updates, validated with the tiny reference-free
COMET checkpoint (tests/fixtures/comet/); the log's fields, best.pt and ema.pt chosen by the metric, a bleu run's
fields as before, and the one-line refusals before anything is written."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from helpers import prepared_reverse_task

from mtkit.config import Config
from mtkit.errors import MtkitError
from mtkit.models.checkpoint import read_checkpoint, resolve_checkpoint
from mtkit.training.trainer import train

COMET = Path(__file__).resolve().parents[2] / "fixtures" / "comet"
QE = {"validate_metric": "qe", "comet_model": str(COMET / "referenceless"), "comet_encoder": str(COMET / "tiny-xlmr")}
# a learning rate that changes the translations within a few updates, so the scores move
STEPS = {"max_steps": 12, "validate_every": 2, "warmup_steps": 1, "lr": 0.01, "seed": 2, "patience": 2, "ema": 0.5}
BLEU_FIELDS = {"step", "epoch", "valid_loss", "valid_ppl", "valid_bleu", "best_bleu", "elapsed_s"}


def stopping_step(records: list[dict], key: str) -> int:
    """The step of the validation at which train.patience (2) validations without a better `key` stop training."""
    best, bad = -math.inf, 0
    for record in records:
        best, bad = (record[key], 0) if record[key] > best else (best, bad + 1)
        if bad >= STEPS["patience"]:
            return record["step"]
    return records[-1]["step"]


def validation_records(config: Config) -> list[dict]:
    records = [json.loads(line) for line in (config.run_path / "log.jsonl").read_text().splitlines()]
    return [record for record in records if "valid_loss" in record]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Config, str]]:
    """The same tiny training validated by COMET-QE (on 20 lines) and by BLEU, with what each said on stderr."""
    found = {}
    for name, keys in (("qe", {**QE, "validate_lines": 20}), ("bleu", {})):
        config = prepared_reverse_task(tmp_path_factory.mktemp(name), **STEPS, **keys)
        with pytest.MonkeyPatch.context() as patch:
            said: list[str] = []
            patch.setattr("mtkit.training.trainer.say", lambda line, lines=said, **_: lines.append(line))
            train(config)
        found[name] = config, "\n".join(said)
    return found


def test_the_log_holds_the_metric_its_cost_and_the_best_by_it(runs):
    config, said = runs["qe"]
    records = validation_records(config)
    assert len({record["valid_qe"] for record in records}) > 1  # the scores move: the choices below mean something
    assert records[-1]["step"] == stopping_step(records, "valid_qe")  # patience counted by the metric
    for record in records:
        assert set(record) == BLEU_FIELDS - {"best_bleu"} | {"valid_qe", "valid_qe_s", "best_qe"}
        assert 0 <= record["valid_bleu"] <= 100 and record["valid_qe_s"] >= 0
    best = max(record["valid_qe"] for record in records)
    assert records[-1]["best_qe"] == pytest.approx(best, abs=1e-4)
    assert f"(best COMET-QE {best:.4f} at step" in said and f"COMET-QE {records[0]['valid_qe']:.4f} (" in said
    assert "best valid COMET-QE" in said.splitlines()[-1]


def test_best_pt_is_the_step_with_the_best_score_and_ema_pt_records_its_own(runs):
    config, said = runs["qe"]
    records = validation_records(config)
    progress = read_checkpoint(config.run_path / "best.pt")["progress"]
    best = max(records, key=lambda record: record["valid_qe"])  # the first of equals, as only a better one replaces it
    assert progress["metric"] == "qe" and progress["best_step"] == best["step"] == progress["step"]
    assert progress["best_score"] == pytest.approx(best["valid_qe"], abs=1e-4)
    assert progress["best_bleu"] == pytest.approx(best["valid_bleu"], abs=0.01)  # the BLEU of that step
    ema = read_checkpoint(config.run_path / "ema.pt")
    final = [json.loads(line) for line in (config.run_path / "log.jsonl").read_text().splitlines()][-1]
    assert final["ema_valid_qe"] == ema["valid_qe"] and final["best_valid_qe"] == progress["best_score"]
    assert "valid_bleu" in ema and "ema_valid_bleu" in final
    chosen = "ema.pt" if ema["valid_qe"] >= progress["best_score"] else "best.pt"
    assert resolve_checkpoint(config.run_path).name == chosen and f"-m RUN uses {chosen}" in said


def test_a_bleu_run_logs_and_saves_as_before(runs):
    config, said = runs["bleu"]
    records = validation_records(config)
    assert all(set(record) == BLEU_FIELDS for record in records)
    assert records[-1]["step"] == stopping_step(records, "valid_bleu")
    qe_records = validation_records(runs["qe"][0])  # the same training: the same BLEU at each step, whatever chose
    both = min(len(records), len(qe_records))
    assert [r["valid_bleu"] for r in qe_records[:both]] == [r["valid_bleu"] for r in records[:both]]
    progress = read_checkpoint(config.run_path / "best.pt")["progress"]
    assert progress["metric"] == "bleu" and progress["best_bleu"] == pytest.approx(
        max(r["valid_bleu"] for r in records), abs=0.01
    )
    assert "COMET" not in said and f"(best {records[-1]['best_bleu']:.2f} at step" in said
    # each run's metric chose its best.pt: the first step of the best BLEU here, of the best COMET-QE there (they
    # differ where those steps differ, which depends on the machine's numerics, so neither is assumed)
    qe_progress = read_checkpoint(runs["qe"][0].run_path / "best.pt")["progress"]
    assert progress["best_step"] == max(records, key=lambda record: record["valid_bleu"])["step"]
    assert qe_progress["best_step"] == max(qe_records, key=lambda record: record["valid_qe"])["step"]
    assert "valid_qe" not in read_checkpoint(config.run_path / "ema.pt")


def test_resuming_under_another_metric_is_one_line_and_writes_nothing(runs):
    config, _ = runs["qe"]
    log = (config.run_path / "log.jsonl").read_text()
    train_keys = {"validate_metric": "bleu", "comet_model": None, "comet_encoder": None, "validate_lines": 0, "max_steps": 10}
    changed = dataclasses.replace(config, train=dataclasses.replace(config.train, **train_keys))
    with pytest.raises(MtkitError, match="the run being resumed chose its best.pt by qe; resume with"):
        train(changed, resume=True)
    assert (config.run_path / "log.jsonl").read_text() == log


def test_a_model_of_the_other_kind_is_refused_before_the_run_directory_exists(tmp_path):
    config = prepared_reverse_task(tmp_path, **STEPS, **{**QE, "comet_model": str(COMET / "regression")})
    with pytest.raises(MtkitError, match="train.validate_metric qe with train.comet_model .*scores against references"):
        train(config)
    assert not config.run_path.exists()
