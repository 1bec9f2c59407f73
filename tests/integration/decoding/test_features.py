"""Decoder features end to end (scoring, prefixes, sampling, n-gram blocking, ensembles, alignments)
on reverse-task models of both architectures, through the Python API and the CLI."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import cli_output, write_text_lines
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.decoding.options import Decoding, Sampling
from mtkit.errors import MtkitError


@pytest.mark.parametrize("beam", [1, 3])
def test_outputs_start_with_their_prefix_and_an_empty_prefix_changes_nothing(model_translator, model_valid, beam):
    sources = model_valid[0][:10]
    prefixes = ["k l" if n % 2 == 0 else "" for n in range(10)]
    plain = model_translator.translate_nbest(sources, Decoding(beam=beam))
    prefixed = model_translator.translate_nbest(sources, Decoding(beam=beam), prefixes=prefixes)
    prefix_ids = model_translator.tokenizers.tgt.encode("k l")
    for n, (before, after) in enumerate(zip(plain, prefixed, strict=True)):
        if prefixes[n]:
            assert after[0].tokens[: len(prefix_ids)] == prefix_ids and after[0].text.startswith("k l")
        else:
            assert after[0].tokens == before[0].tokens and after[0].score == pytest.approx(before[0].score, abs=1e-5)


def test_prefix_cli_and_its_line_count_check(model_run, model_valid, tmp_path):
    source = write_text_lines(tmp_path / "src", model_valid[0][:4])
    prefix = write_text_lines(tmp_path / "prefix", ["a", "", "b c", ""])
    lines = cli_output("translate", "-m", model_run.run_path, "-i", source, "--prefix", prefix).splitlines()
    assert lines[0].startswith("a") and lines[2].startswith("b c")
    assert (
        lines[1]
        == cli_output(
            "translate", "-m", model_run.run_path, "-i", write_text_lines(tmp_path / "one", [model_valid[0][1]])
        ).strip()
    )
    short = write_text_lines(tmp_path / "short", ["a"])
    result = CliRunner().invoke(app, ["translate", "-m", str(model_run.run_path), "-i", str(source), "--prefix", str(short)])
    assert result.exit_code == 2 and "has 1 lines but" in result.output


def test_sampling_draws_nbest_samples_and_the_same_seed_draws_the_same(model_translator, model_valid):
    sources = model_valid[0][:8]
    decoding = Decoding(nbest=5, sampling=Sampling(top_k=0, temperature=3.0, seed=5))
    first, again = model_translator.translate_nbest(sources, decoding), model_translator.translate_nbest(sources, decoding)
    assert all(len(samples) == 5 for samples in first)
    assert [[t.tokens for t in s] for s in first] == [[t.tokens for t in s] for s in again]
    assert len({tuple(t.tokens) for samples in first for t in samples}) > 8  # hot samples differ
    greedy = model_translator.translate_nbest(sources, Decoding(beam=1))
    top1 = model_translator.translate_nbest(sources, Decoding(sampling=Sampling(top_k=1, seed=1)))
    assert [s[0].tokens for s in top1] == [g[0].tokens for g in greedy]
    with pytest.raises(MtkitError, match="--beam 4 with --sampling"):
        model_translator.translate_nbest(sources, Decoding(beam=4, sampling=Sampling()))


def test_sampling_cli_is_reproducible_by_seed(model_run, model_valid, tmp_path):
    source = write_text_lines(tmp_path / "src", model_valid[0][:6])
    arguments = [
        "translate",
        "-m",
        model_run.run_path,
        "-i",
        source,
        "--sampling",
        "topp:0.9",
        "--temperature",
        "2",
        "--nbest",
        "3",
    ]
    first, again = cli_output(*arguments, "--seed", "1"), cli_output(*arguments, "--seed", "1")
    assert first == again and len(first.splitlines()) == 6
    assert all(len(line.split("\t")) == 6 for line in first.splitlines())  # 3 samples and their scores
    bad = CliRunner().invoke(app, ["translate", "-m", str(model_run.run_path), "-i", str(source), "--sampling", "top5"])
    assert bad.exit_code == 2 and "--sampling top5: give topk:K" in bad.output
    for option in (["--seed", str(2**70)], ["--temperature", "nan"]):
        bad = CliRunner().invoke(
            app, ["translate", "-m", str(model_run.run_path), "-i", str(source), "--sampling", "topk:5", *option]
        )
        assert bad.exit_code == 2 and option[0] in bad.output and "Traceback" not in bad.output, bad.output
    widest = cli_output(
        "translate", "-m", str(model_run.run_path), "-i", str(source), "--sampling", "topk:5", "--seed", str(2**64 - 1)
    )
    assert len(widest.splitlines()) == 6


def test_no_repeat_ngram_leaves_no_repeated_ngram(model_run, model_translator, tmp_path):
    sources = ["a a a b a a a b", "c c c c c c", "a b a b a b a b"]
    for beam in (1, 3):
        for found in model_translator.translate_nbest(sources, Decoding(beam=beam, no_repeat_ngram=2)):
            pieces = found[0].tokens
            bigrams = Counter(zip(pieces, pieces[1:], strict=False))
            assert all(count == 1 for count in bigrams.values())
    lines = cli_output(
        "translate", "-m", model_run.run_path, "-i", write_text_lines(tmp_path / "src", sources), "--no-repeat-ngram", "1"
    ).splitlines()
    assert all(len(line.split()) == len(set(line.split())) for line in lines)
