"""`mtkit evaluate` with several systems: paired significance tests, problem flags and their report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.textio import read_lines

SYSTEMS = Path(__file__).resolve().parents[2] / "fixtures" / "systems"


@pytest.mark.slow
def test_the_cli_compares_systems_reports_flags_and_writes_the_tsv(test200, tmp_path):
    source, reference = test200
    hypotheses = read_lines(SYSTEMS / "demo_transformer.en")
    hypotheses[3] = ""
    broken = tmp_path / "broken.en"
    broken.write_text("".join(line + "\n" for line in hypotheses))
    arguments = ["evaluate", "--hyp", str(SYSTEMS / "demo_transformer.en"), "--hyp", str(broken), "--ref", str(reference)]
    arguments += ["--src", str(source), "--flags", str(tmp_path / "flags.tsv"), "--bootstrap-samples", "100"]
    result = CliRunner().invoke(app, [*arguments, "--randomisation-trials", "100", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [system["flags"]["empty"] for system in report["systems"]] == [0, 1]
    assert report["comparison"]["bootstrap_samples"] == 100 and report["comparison"]["seed"] == 12345
    rows = [line.split("\t") for line in (tmp_path / "flags.tsv").read_text().splitlines()]
    assert rows[0] == ["system", "line", "flags", "source", "hypothesis", "reference"]
    assert [str(broken), "4", "empty"] in [row[:3] for row in rows]
    text = CliRunner().invoke(app, arguments[:7] + ["--randomisation-trials", "100", "--bootstrap-samples", "100"]).stdout
    assert "paired tests against" in text and "problems: loop" in text


def test_models_are_compared_or_ensembled(reverse_run, reverse_rnn_run, tmp_path):
    raw = reverse_run.data_path.parent / "raw"
    models = ["-m", str(reverse_run.run_path), "-m", str(reverse_rnn_run.run_path)]
    common = ["--src", str(raw / "valid.src"), "--ref", str(raw / "valid.tgt"), "--json"]
    compared = CliRunner().invoke(app, ["evaluate", *models, "--compare", *common, "--randomisation-trials", "100"])
    assert compared.exit_code == 0, compared.output
    assert [system["name"] for system in json.loads(compared.stdout)["systems"]] == [models[1], models[3]]
    ensembled = CliRunner().invoke(app, ["evaluate", *models, *common])
    assert ensembled.exit_code == 0 and "scores" in json.loads(ensembled.stdout)
    both = CliRunner().invoke(app, ["evaluate", *models, "--compare", *common, "-o", str(tmp_path / "x")])
    assert both.exit_code == 2 and "leave it out with --compare" in both.output


def test_the_test_split_is_checked_against_the_recipes_band(reverse_run, tmp_path):
    from mtkit.models.checkpoint import read_checkpoint, save_checkpoint

    payload = read_checkpoint(reverse_run.run_path / "best.pt")
    payload["config"]["data"]["test"] = payload["config"]["data"]["valid"]  # the reverse task's test split: its valid one
    for band, verdict in (("90-100", "inside"), ("100.5-101", "below"), ("1-2", "above")):
        payload["config"]["expected_test_bleu"] = band
        save_checkpoint(payload, tmp_path / "model.pt")
        result = CliRunner().invoke(app, ["evaluate", "-m", str(tmp_path / "model.pt"), "--split", "test", "--beam", "1"])
        assert result.exit_code == 0, result.output
        low, high = band.split("-")
        assert result.stdout.splitlines()[-1].endswith(f"is {verdict} the recipe's expected band {low}-{high}")
    valid = CliRunner().invoke(app, ["evaluate", "-m", str(tmp_path / "model.pt"), "--split", "valid", "--beam", "1"])
    assert "expected band" not in valid.stdout  # the band is the test split's
