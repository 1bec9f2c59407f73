"""End-to-end tests of the `mtkit` command line through Typer's CliRunner on a tiny Multi30k model.

One recipe (`cli_workspace` and its `cli_run`, in shared_fixtures.py) trains a 1-layer, 32-wide Transformer for
30 steps on 1500 pairs through `tokenizer train`, `prepare` and `train`; every command then runs
against it, and bad input must give one clear line on stderr, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import CLI_RECIPE_STEPS, assert_one_line_error, invoke, stdout_lines, succeeded

from mtkit.models.checkpoint import read_checkpoint

SOURCES = [
    "Ein Hund läuft über die Wiese.",
    "",
    "Zwei Männer stehen vor einem Gebäude.",
    "",
    "Ein Kind spielt im Wasser.",
]


# The pipeline


@pytest.mark.slow
def test_tokenizer_train_writes_one_joint_model(cli_workspace):
    result = succeeded(cli_workspace["results"]["tokenizer"])
    assert "joint" in result.stdout
    assert str(cli_workspace["data"]) in result.stdout
    assert (cli_workspace["data"] / "spm.model").is_file()


def test_prepare_writes_every_split_and_a_report(cli_workspace):
    succeeded(cli_workspace["results"]["prepare"])
    data = cli_workspace["data"]
    for split in ("train", "valid", "test"):
        assert (data / split).is_dir()
    report = json.loads((data / "prepare_report.json").read_text(encoding="utf-8"))
    assert report["clean"]["total"] == 1500
    assert 1400 <= report["splits"]["train"]["pairs"] <= 1500
    assert report["splits"]["valid"]["pairs"] == 60
    assert report["splits"]["test"]["pairs"] == 60


def test_train_writes_a_self_describing_run(cli_workspace, cli_run):
    for name in ("best.pt", "last.pt", "config.yaml", "log.jsonl"):
        assert (cli_run / name).is_file(), name
    saved = yaml.safe_load((cli_run / "config.yaml").read_text(encoding="utf-8"))
    assert saved["model"]["d_model"] == 32
    assert saved["train"]["max_steps"] == CLI_RECIPE_STEPS
    assert read_checkpoint(cli_run / "last.pt")["step"] == CLI_RECIPE_STEPS
    records = [json.loads(line) for line in (cli_run / "log.jsonl").read_text(encoding="utf-8").splitlines()]
    train_steps = [r["step"] for r in records if "train_loss" in r]
    valid_steps = [r["step"] for r in records if "valid_bleu" in r]
    assert train_steps == list(range(5, CLI_RECIPE_STEPS + 1, 5))
    assert valid_steps == [15, 30]
    assert all(r["train_loss"] > 0 for r in records if "train_loss" in r)
    assert "step 30" in cli_workspace["results"]["train"].stderr


# translate


def test_translate_gives_one_line_per_input_line_in_order(cli_run):
    result = succeeded(invoke("translate", "-m", cli_run, "--beam", "1", input="\n".join(SOURCES) + "\n"))
    lines = stdout_lines(result)
    assert len(lines) == len(SOURCES)
    assert lines[1] == lines[3] == ""
    # Each line is the translation of its own input, whatever the batch order was.
    for source, line in zip(SOURCES, lines, strict=True):
        if source:
            alone = stdout_lines(succeeded(invoke("translate", "-m", cli_run, "--beam", "1", input=source + "\n")))
            assert alone == [line]


def test_translate_keeps_each_score_with_its_own_input(cli_run):
    # A 30-step model says much the same for every input; its scores still tell the inputs apart.
    def best(text: str) -> list[tuple[str, float]]:
        lines = stdout_lines(succeeded(invoke("translate", "-m", cli_run, "--nbest", "2", input=text)))
        return [(line.split("\t")[0], float(line.split("\t")[1])) for line in lines]

    batched = best("\n".join(SOURCES) + "\n")
    assert len(batched) == len(SOURCES)
    scores = [score for source, (_, score) in zip(SOURCES, batched, strict=True) if source]
    assert len(set(scores)) == len(scores), "the check below needs different scores per input"
    for source, (text, score) in zip(SOURCES, batched, strict=True):
        if source:
            [(alone_text, alone_score)] = best(source + "\n")
            assert text == alone_text
            assert score == pytest.approx(alone_score, abs=2e-4)
        else:
            assert (text, score) == ("", 0.0)


def test_translate_input_without_final_newline(cli_run):
    result = succeeded(invoke("translate", "-m", cli_run, input="Ein Hund.\nEine Katze."))
    assert len(stdout_lines(result)) == 2


def test_translate_empty_input_gives_no_output(cli_run):
    assert succeeded(invoke("translate", "-m", cli_run, input="")).stdout == ""


def test_translate_files(cli_run, tmp_path):
    source = tmp_path / "in.de"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    target = tmp_path / "out.en"
    result = succeeded(invoke("translate", "-m", cli_run, "-i", source, "-o", target))
    assert result.stdout == ""
    lines = target.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""
    assert len(lines[:-1]) == len(SOURCES)
    assert lines[1] == lines[3] == ""
    piped = stdout_lines(succeeded(invoke("translate", "-m", cli_run, input=source.read_text(encoding="utf-8"))))
    assert lines[:-1] == piped


def test_translate_a_checkpoint_file(cli_run):
    text = "Ein Hund läuft über die Wiese.\n"
    from_dir = succeeded(invoke("translate", "-m", cli_run, input=text)).stdout
    from_file = succeeded(invoke("translate", "-m", cli_run / "best.pt", input=text)).stdout
    assert from_dir == from_file


def test_translate_nbest_prints_translations_and_scores(cli_run):
    result = succeeded(invoke("translate", "-m", cli_run, "--beam", "3", "--nbest", "3", input="\n".join(SOURCES) + "\n"))
    lines = stdout_lines(result)
    assert len(lines) == len(SOURCES)
    for source, line in zip(SOURCES, lines, strict=True):
        fields = line.split("\t")
        assert len(fields) == 6, line
        texts, scores = fields[0::2], [float(score) for score in fields[1::2]]
        if source:
            assert scores == sorted(scores, reverse=True)
            assert all(score < 0 for score in scores)
            assert len(set(texts)) == 3  # three different hypotheses
        else:
            assert texts == ["", "", ""]
    best = stdout_lines(succeeded(invoke("translate", "-m", cli_run, "--beam", "3", input=SOURCES[0] + "\n")))
    assert lines[0].split("\t")[0] == best[0]


def test_python_api_translator(cli_run):
    from mtkit.decoding.translator import Translator

    translator = Translator.load(cli_run, device="cpu")
    outputs = translator.translate(SOURCES, beam=1)
    assert len(outputs) == len(SOURCES)
    assert outputs[1] == outputs[3] == ""
    cli = stdout_lines(succeeded(invoke("translate", "-m", cli_run, "--beam", "1", input="\n".join(SOURCES) + "\n")))
    assert outputs == cli


# evaluate


@pytest.fixture(scope="module")
def hyp_and_ref(cli_workspace: dict) -> tuple[Path, Path]:
    """A noisy hypothesis file (the first references, some words dropped) and its reference file."""
    ref = cli_workspace["corpus"] / "val.en"
    references = ref.read_text(encoding="utf-8").splitlines()
    hyp = cli_workspace["root"] / "hyp.en"
    hyp.write_text("".join(" ".join(line.split()[::2]) + "\n" for line in references), encoding="utf-8")
    return hyp, ref


def test_evaluate_files_prints_scores_with_signatures(hyp_and_ref):
    hyp, ref = hyp_and_ref
    *lines, problems = succeeded(invoke("evaluate", "--hyp", hyp, "--ref", ref)).stdout.splitlines()
    names = [line.split("  ")[0].strip() for line in lines]
    assert names == ["BLEU", "chrF", "TER", "BLEU (lowercased, tokenized)"]
    assert all("signature: " in line for line in lines)
    assert problems.startswith("problems: loop 0, copy 0, empty 0,") and problems.endswith("(of 60 sentences)")
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in lines[0]
    assert "case:lc" in lines[3]


def test_evaluate_json_parses(hyp_and_ref):
    hyp, ref = hyp_and_ref
    data = json.loads(succeeded(invoke("evaluate", "--hyp", hyp, "--ref", ref, "--json")).stdout)
    assert data["num_sentences"] == 60
    assert set(data["scores"]) == {"BLEU", "chrF", "TER", "BLEU (lowercased, tokenized)"}
    assert 0 < data["scores"]["BLEU"]["score"] < 100
    assert data["scores"]["chrF"]["signature"].startswith("nrefs:1")
    perfect = json.loads(succeeded(invoke("evaluate", "--hyp", ref, "--ref", ref, "--json")).stdout)
    assert perfect["scores"]["BLEU"]["score"] == pytest.approx(100)
    assert perfect["scores"]["TER"]["score"] == pytest.approx(0)


def test_evaluate_model_on_the_test_split(cli_run, tmp_path):
    output = tmp_path / "test.hyp"
    result = succeeded(invoke("evaluate", "-m", cli_run, "--split", "test", "--beam", "1", "-o", output, "--json"))
    data = json.loads(result.stdout)
    assert data["num_sentences"] == 60
    assert 0 <= data["scores"]["BLEU"]["score"] <= 100
    assert len(output.read_text(encoding="utf-8").split("\n")) == 61


def test_evaluate_model_on_a_source_file(cli_run, cli_workspace):
    corpus = cli_workspace["corpus"]
    result = succeeded(invoke("evaluate", "-m", cli_run, "--src", corpus / "val.de", "--ref", corpus / "val.en", "--beam", "1"))
    assert result.stdout.startswith("BLEU")


# Resuming


@pytest.fixture
def run_copy(cli_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(cli_run, copy)
    return copy


def test_train_into_an_existing_run_needs_resume(cli_workspace, run_copy):
    result = invoke("train", cli_workspace["recipe"], "--set", f"run_dir={run_copy}")
    assert_one_line_error(result, str(run_copy), "--resume", "--overwrite")
    assert read_checkpoint(run_copy / "last.pt")["step"] == CLI_RECIPE_STEPS  # untouched


@pytest.mark.slow
def test_resume_continues_from_the_last_step(cli_workspace, run_copy):
    result = succeeded(
        invoke("train", cli_workspace["recipe"], "--resume", "--set", f"run_dir={run_copy}", "--set", "train.max_steps=40")
    )
    assert "step 40" in result.stderr
    assert f"M parameters on cpu (fp32), resuming at step {CLI_RECIPE_STEPS};" in result.stderr
    assert read_checkpoint(run_copy / "last.pt")["step"] == 40
    records = [json.loads(line) for line in (run_copy / "log.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["step"] for r in records if "train_loss" in r] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert [r["step"] for r in records if "valid_bleu" in r] == [15, 30, 40]
    assert yaml.safe_load((run_copy / "config.yaml").read_text(encoding="utf-8"))["train"]["max_steps"] == 40


@pytest.mark.slow
def test_overwrite_starts_the_run_again(cli_workspace, run_copy):
    result = invoke("train", cli_workspace["recipe"], "--overwrite", "--set", f"run_dir={run_copy}", "--set", "train.max_steps=5")
    succeeded(result)
    assert "training transformer: " in result.stderr and "M parameters on cpu (fp32), starting;" in result.stderr
    assert read_checkpoint(run_copy / "last.pt")["step"] == 5
    records = [json.loads(line) for line in (run_copy / "log.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["step"] for r in records] == [0, 5, 5]  # the epoch's corpus draw, one training record, one validation


def test_resume_without_a_run_is_an_error(cli_workspace, tmp_path):
    empty = tmp_path / "new-run"
    assert_one_line_error(invoke("train", cli_workspace["recipe"], "--resume", "--set", f"run_dir={empty}"), str(empty), "resume")


# Bad input: one line on stderr, exit status 2, no traceback


@pytest.fixture
def bad_recipe(cli_workspace: dict, tmp_path: Path):
    """Write a copy of the tiny recipe whose data.<split> is replaced, with its own data_dir holding the tokenizer."""

    def write(**splits: dict) -> Path:
        data = yaml.safe_load(cli_workspace["recipe"].read_text(encoding="utf-8"))
        data["data_dir"] = str(tmp_path / "data")
        data["run_dir"] = str(tmp_path / "run")
        data["data"].update(splits)
        (tmp_path / "data").mkdir(exist_ok=True)
        shutil.copy(cli_workspace["data"] / "spm.model", tmp_path / "data" / "spm.model")
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return path

    return write


def test_prepare_mismatched_parallel_files(cli_workspace, bad_recipe, tmp_path):
    src = tmp_path / "short.de"
    src.write_text("Ein Hund.\nEine Katze.\n", encoding="utf-8")
    tgt = cli_workspace["corpus"] / "val.en"
    recipe = bad_recipe(valid={"src": str(src), "tgt": str(tgt)})
    message = assert_one_line_error(invoke("prepare", recipe), str(src), str(tgt))
    assert "has 2 lines" in message and "has 60" in message
    assert not (tmp_path / "data" / "prepare_report.json").exists()


def test_prepare_missing_file(cli_workspace, bad_recipe, tmp_path):
    missing = tmp_path / "missing.de"
    recipe = bad_recipe(test={"src": str(missing), "tgt": str(cli_workspace["corpus"] / "val.en")})
    assert_one_line_error(invoke("prepare", recipe), str(missing), "data.test.src")


def test_prepare_non_utf8_input(cli_workspace, bad_recipe, tmp_path):
    src = tmp_path / "latin1.de"
    src.write_bytes("Ein Hund.\nZwei Männer.\n".encode() + b"Gr\xff\xfcn.\n")
    tgt = tmp_path / "ok.en"
    tgt.write_text("A dog.\nTwo men.\nGreen.\n", encoding="utf-8")
    recipe = bad_recipe(valid={"src": str(src), "tgt": str(tgt)})
    assert_one_line_error(invoke("prepare", recipe), f"{src}:3:", "UTF-8")


def test_tokenizer_train_missing_file(cli_workspace, bad_recipe, tmp_path):
    missing = tmp_path / "missing.en"
    recipe = bad_recipe(train={"src": str(cli_workspace["corpus"] / "val.de"), "tgt": str(missing)})
    assert_one_line_error(invoke("tokenizer", "train", recipe), str(missing), "data.train.tgt")


@pytest.mark.parametrize("command", [("prepare",), ("train",), ("tokenizer", "train")])
def test_unknown_set_key_names_the_closest_key(cli_workspace, command):
    result = invoke(*command, cli_workspace["recipe"], "--set", "train.batch_token=10")
    assert_one_line_error(result, "'train.batch_token'", "did you mean 'train.batch_tokens'")


def test_invalid_choice_via_set(cli_workspace):
    assert_one_line_error(invoke("train", cli_workspace["recipe"], "--set", "model.norm=mid"), "'model.norm'", "pre, post")


def test_bad_duration_via_set(cli_workspace, tmp_path):
    result = invoke("train", cli_workspace["recipe"], "--set", "train.max_time=soon", "--set", f"run_dir={tmp_path / 'run'}")
    assert_one_line_error(result, "train.max_time", "'soon'")


def test_translate_non_utf8_file(cli_run, tmp_path):
    source = tmp_path / "bad.de"
    source.write_bytes(b"Ein Hund.\n\nGr\xffn.\n")
    assert_one_line_error(invoke("translate", "-m", cli_run, "-i", source), f"{source}:3:", "UTF-8")


def test_translate_non_utf8_stdin(cli_run):
    assert_one_line_error(invoke("translate", "-m", cli_run, input=b"Ein Hund.\n\xff\n"), "<stdin>:2:", "UTF-8")


def test_translate_output_into_a_missing_directory(cli_run, tmp_path):
    target = tmp_path / "no-such-dir" / "out.en"
    assert_one_line_error(
        invoke("translate", "-m", cli_run, "-o", target, input="Ein Hund.\n"), str(target), "directory does not exist"
    )


def test_translate_missing_input_file(cli_run, tmp_path):
    missing = tmp_path / "nothing.de"
    assert_one_line_error(invoke("translate", "-m", cli_run, "-i", missing), str(missing), "not found")


def test_evaluate_mismatched_lengths(hyp_and_ref, tmp_path):
    hyp, ref = hyp_and_ref
    short = tmp_path / "short.en"
    short.write_text("A dog.\n", encoding="utf-8")
    message = assert_one_line_error(invoke("evaluate", "--hyp", short, "--ref", ref), "1 lines", "60")
    assert "reference 1" in message


def test_evaluate_missing_hypothesis_file(hyp_and_ref, tmp_path):
    _, ref = hyp_and_ref
    missing = tmp_path / "missing.hyp"
    assert_one_line_error(invoke("evaluate", "--hyp", missing, "--ref", ref), str(missing))


def test_evaluate_model_without_split(cli_run):
    assert_one_line_error(invoke("evaluate", "-m", cli_run), "--split")
