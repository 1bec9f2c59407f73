"""Every option of translate, score, evaluate, serve, export, average and plot drawn with hostile
values (huge, negative, zero, NaN, empty, wrong type, missing files, directories where files belong,
binary or truncated files): the command succeeds, or prints one `mtkit: error:` line and exits 2;
never a traceback. Derandomised under CI=true."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mtkit.cli import app

CI = os.environ.get("CI") == "true"
FUZZ = settings(max_examples=80 if CI else 25, derandomize=CI, deadline=None, suppress_health_check=list(HealthCheck))

NUMBERS = st.sampled_from(["0", "-1", "1", "2", "3", "64", "1e400", "nan", "inf", "-inf", "2.5", "", "abc", str(2**70), "-0"])
TEXTS = st.sampled_from(["", " ", "x", "topk:5", "topp:0.9", "full", "topk:-1", "cuda:9", "cpu", "\u202e", "a" * 300])


@pytest.fixture(scope="module")
def places(reverse_run, reverse_export, tmp_path_factory) -> dict[str, str]:
    """Named paths a drawn option may point at: good ones and bad ones."""
    root = tmp_path_factory.mktemp("fuzz")
    raw = reverse_run.data_path.parent / "raw"
    (root / "empty.txt").write_text("")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (root / "two.txt").write_text("a b\nc d\n")
    (root / "truncated.pt").write_bytes((reverse_run.run_path / "best.pt").read_bytes()[:1000])
    (root / "bad.jsonl").write_text('["a"]\n[\n')
    (root / "adir").mkdir()
    return {
        "run": str(reverse_run.run_path),
        "export": str(reverse_export),
        "checkpoint": str(reverse_run.run_path / "best.pt"),
        "truncated": str(root / "truncated.pt"),
        "source": str(raw / "valid.src"),
        "target": str(raw / "valid.tgt"),
        "empty": str(root / "empty.txt"),
        "binary": str(root / "binary.bin"),
        "two": str(root / "two.txt"),
        "badjson": str(root / "bad.jsonl"),
        "dir": str(root / "adir"),
        "missing": str(root / "missing" / "nothing.txt"),
        "out": str(root / "out.txt"),
        "outdir": str(root / "export_out"),
        "png": str(root / "curves.png"),
    }


PATHS = st.sampled_from(["run", "export", "checkpoint", "truncated", "source", "target", "empty", "binary", "two", "badjson"])
ANY_PATH = PATHS | st.sampled_from(["dir", "missing", "out"])
OUTPUTS = st.sampled_from(["out", "dir", "missing", "outdir", "png"])
MODELS = st.sampled_from(["run", "run", "export", "checkpoint", "truncated", "dir", "missing", "empty"])

COMMANDS = {
    "translate": {
        "-m": MODELS,
        "-i": ANY_PATH,
        "-o": OUTPUTS,
        "--beam": NUMBERS,
        "--nbest": NUMBERS,
        "--length-penalty": NUMBERS,
        "--prefix": ANY_PATH,
        "--sampling": TEXTS,
        "--temperature": NUMBERS,
        "--seed": NUMBERS,
        "--no-repeat-ngram": NUMBERS,
        "--alignment-layer": NUMBERS,
        "--bad-bytes": st.sampled_from(["error", "replace", "ignore"]),
        "--engine": st.sampled_from(["auto", "pytorch", "ctranslate2", "tensorflow"]),
        "--device": TEXTS,
        "--buffer-lines": NUMBERS,
        "--constraints": ANY_PATH,
        "--constraints-order": st.sampled_from(["any", "given", "random"]),
        "--glossary": ANY_PATH,
    },
    "score": {"-m": MODELS, "--src": ANY_PATH, "--tgt": ANY_PATH, "-o": OUTPUTS, "--engine": st.sampled_from(["auto", "x"])},
    "evaluate": {
        "--hyp": ANY_PATH,
        "--ref": ANY_PATH,
        "-m": MODELS,
        "--split": st.sampled_from(["valid", "test", "train"]),
        "--src": ANY_PATH,
        "--beam": NUMBERS,
        "--seed": NUMBERS,
        "--bootstrap-samples": NUMBERS,
        "--randomisation-trials": st.sampled_from(["1", "10", "0", "-5", "x"]),
        "--flag-rule": st.sampled_from(["loop_ngram=3", "copy_ratio=nan", "x=1", "loop_count=-1", ""]),
        "--flags": OUTPUTS,
    },
    "serve": {
        "-m": MODELS,
        "--port": NUMBERS,
        "--max-wait-ms": NUMBERS,
        "--max-queue": NUMBERS,
        "--max-lines": NUMBERS,
        "--max-chars": NUMBERS,
        "--batch-lines": NUMBERS,
        "--workers": NUMBERS,
        "--max-work": NUMBERS,
        "--request-timeout": NUMBERS,
        "--engine": st.sampled_from(["auto", "pytorch", "ctranslate2"]),
        "--device": TEXTS,
    },
    "export": {"-m": MODELS, "-o": OUTPUTS, "--quantization": st.sampled_from(["int8", "float16", "int4"])},
    "average": {"-m": MODELS, "--last": NUMBERS, "-o": OUTPUTS},
}


def arguments(command: str, drawn: dict[str, str], places: dict[str, str]) -> list[str]:
    argv = [command]
    for option, value in drawn.items():
        argv += [option, places.get(value, value)]
    return argv


def check(argv: list[str]) -> None:
    result = CliRunner().invoke(app, argv)
    if result.exit_code == 0:
        return
    assert result.exit_code == 2, (argv, result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtkit: error: "), (argv, result.stderr)
    assert "Traceback" not in result.output


def drawn_options(command: str) -> st.SearchStrategy[dict[str, str]]:
    return st.fixed_dictionaries({}, optional=COMMANDS[command])


@pytest.fixture
def no_listening(monkeypatch):
    """`mtkit serve` checks its options and loads its model, then returns instead of serving forever."""
    from mtkit.serving import app as serving

    monkeypatch.setattr(serving._GracefulServer, "run", lambda self: None)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["translate", "score", "evaluate", "export", "average"])
def test_any_option_values_give_output_or_one_error_line(places, command, tmp_path):
    @FUZZ
    @given(drawn=drawn_options(command))
    def run(drawn: dict[str, str]) -> None:
        check(arguments(command, drawn, {**places, "outdir": str(tmp_path / "export_out"), "out": str(tmp_path / "out.txt")}))

    run()


@pytest.mark.slow
def test_serve_options_are_checked_before_serving(places, no_listening):
    @FUZZ
    @given(drawn=drawn_options("serve"))
    def run(drawn: dict[str, str]) -> None:
        check(arguments("serve", drawn, places))

    run()


@pytest.mark.slow
@FUZZ
@given(runs=st.lists(ANY_PATH, max_size=3), output=OUTPUTS)
def test_plot_draws_or_gives_one_error_line(places, tmp_path_factory, runs, output):
    target = str(tmp_path_factory.mktemp("plot") / "curves.png") if output == "png" else places[output]
    check(["plot", *(places[r] for r in runs), "-o", target])
