"""`mtkit evaluate` with several systems: paired significance tests, problem flags and their report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.errors import MtkitError
from mtkit.flags import FlagRules, flag_corpus, parse_rules
from mtkit.significance import compare_systems
from mtkit.textio import read_lines

SYSTEMS = Path(__file__).parent / "data" / "systems"


@pytest.fixture
def test200(multi30k_slice) -> tuple[Path, Path]:
    return multi30k_slice("test_2016_flickr", "de", 200), multi30k_slice("test_2016_flickr", "en", 200)


def test_a_system_against_itself_is_not_significant_and_a_weaker_one_is(test200):
    references = read_lines(test200[1])
    transformer, rnn = read_lines(SYSTEMS / "demo_transformer.en"), read_lines(SYSTEMS / "rnn_12min.en")
    result = compare_systems(["transformer", "itself", "rnn"], [transformer, transformer, rnn], [references], 1, 200, 500)
    for metric in ("BLEU", "chrF", "TER"):
        baseline, itself, weaker = result.scores[metric]
        assert baseline.p_bootstrap is None and baseline.p_randomisation is None
        assert itself.p_bootstrap == 1.0 and itself.p_randomisation == 1.0 and itself.score == baseline.score
        assert weaker.p_bootstrap < 0.05 and weaker.p_randomisation < 0.05
        assert abs(baseline.mean - baseline.score) < baseline.ci  # the bootstrap mean lies near the score
    assert result.scores["BLEU"][2].score < result.scores["BLEU"][0].score
    assert result.scores["TER"][2].score > result.scores["TER"][0].score  # TER: lower is better


def test_the_same_seed_repeats_a_comparison_exactly(test200):
    references = read_lines(test200[1])
    systems = [read_lines(SYSTEMS / "demo_transformer.en"), read_lines(SYSTEMS / "rnn_12min.en")]
    runs = [compare_systems(["a", "b"], systems, [references], seed, 100, 100).to_dict() for seed in (3, 3, 4)]
    assert runs[0] == runs[1] and runs[0]["seed"] == 3
    assert runs[0]["scores"]["BLEU"][0]["mean"] != runs[2]["scores"]["BLEU"][0]["mean"]


def test_exactly_the_injected_loop_copy_and_empty_output_are_flagged(test200):
    sources, references = read_lines(test200[0]), read_lines(test200[1])
    hypotheses = list(references)  # good translations everywhere...
    words = references[5].split()
    loop = words[:2]
    while len(" ".join(loop)) < len(references[5]):
        loop += words[2:4]
    hypotheses[5] = " ".join(loop)  # ...but a loop as long as the reference,
    hypotheses[17] = sources[17]  # a copied source,
    hypotheses[42] = ""  # and an empty output
    flags = flag_corpus(hypotheses, references, sources, FlagRules())
    assert {n: found for n, found in enumerate(flags) if found} == {5: ["loop"], 17: ["copy"], 42: ["empty"]}


def test_runaway_and_truncated_outputs_are_flagged_by_length():
    sources = ["ein kleiner Hund läuft über die grüne Wiese"] * 3
    references = ["a small dog runs across the green meadow"] * 3
    hypotheses = [references[0], "a dog", references[0] + " while a man watches from a bench in the park near the lake"]
    assert flag_corpus(hypotheses, references, sources, FlagRules()) == [[], ["too_short"], ["too_long"]]
    stutter = flag_corpus(["People are assembembembembembled."], ["People are assembling."], None, FlagRules())
    assert stutter == [["loop"]]


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


@pytest.mark.parametrize(
    ("rule", "message"),
    [("loops=3", "unknown threshold 'loops'"), ("loop_count=x", "'x' is not a number"), ("length_band=0", "give a number > 0")],
)
def test_a_bad_flag_rule_is_one_clear_error(rule, message):
    with pytest.raises(MtkitError, match=message):
        parse_rules([rule])
    assert parse_rules(["loop_count=4", "copy_ratio=0.9"]) == FlagRules(loop_count=4, copy_ratio=0.9)


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
    from mtkit.checkpoint import atomic_save, read_checkpoint

    payload = read_checkpoint(reverse_run.run_path / "best.pt")
    payload["config"]["data"]["test"] = payload["config"]["data"]["valid"]  # the reverse task's test split: its valid one
    for band, verdict in (("90-100", "inside"), ("100.5-101", "below"), ("1-2", "above")):
        payload["config"]["expected_test_bleu"] = band
        atomic_save(payload, tmp_path / "model.pt")
        result = CliRunner().invoke(app, ["evaluate", "-m", str(tmp_path / "model.pt"), "--split", "test", "--beam", "1"])
        assert result.exit_code == 0, result.output
        low, high = band.split("-")
        assert result.stdout.splitlines()[-1].endswith(f"is {verdict} the recipe's expected band {low}-{high}")
    valid = CliRunner().invoke(app, ["evaluate", "-m", str(tmp_path / "model.pt"), "--split", "valid", "--beam", "1"])
    assert "expected band" not in valid.stdout  # the band is the test split's
