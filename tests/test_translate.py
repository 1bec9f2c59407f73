"""The translation engine: one output per input, in order, whatever the batching."""

from __future__ import annotations

import dataclasses

import pytest

from mtkit import Translator


@pytest.fixture(scope="module")
def translator(reverse_run) -> Translator:
    return Translator.load(reverse_run.run_path)


def test_outputs_keep_input_order_across_many_small_batches(translator):
    lines = ["a b c", "", "d e f g h i j", "k l", "   ", "a", "b c d e f"]
    one_by_one = [translator.translate([line])[0] for line in lines]
    tiny_batches = Translator(
        translator.engine, translator.tokenizers, dataclasses.replace(translator.decode, batch_tokens=10), translator.normalize
    )
    assert tiny_batches.translate(lines) == one_by_one
    assert translator.translate(lines) == one_by_one
    assert one_by_one[1] == "" and one_by_one[4] == ""
    assert one_by_one[0] == "c b a"


def test_nbest_returns_ranked_distinct_hypotheses(translator):
    results = translator.translate_nbest(["a b c d", "e f"], beam=4, nbest=3)
    assert [len(r) for r in results] == [3, 3]
    for hypotheses in results:
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hypotheses}) == 3
    assert results[0][0].text == "d c b a"


def test_beam_one_equals_greedy_output(translator):
    lines = ["a b c", "l k j i h", "g"]
    assert translator.translate(lines, beam=1) == [h[0].text for h in translator.translate_nbest(lines, beam=1)]


def test_input_is_normalised_like_training_data(translator):
    assert translator.translate(["a\u0301 b"])[0] == translator.translate(["\u00e1 b"])[0]


def test_output_length_is_capped_by_max_len(translator):
    capped = Translator(
        translator.engine,
        translator.tokenizers,
        dataclasses.replace(translator.decode, max_len_a=0.0, max_len_b=2),
        translator.normalize,
    )
    for hypothesis in capped.translate_nbest(["a b c d e f g"], beam=2)[0]:
        assert len(hypothesis.tokens) <= 2


def test_very_long_input_is_translated_to_one_line(translator):
    output = translator.translate([" ".join("abcdefghijkl" * 60)])
    assert len(output) == 1 and isinstance(output[0], str)


def test_over_long_lines_are_translated_in_segments(translator):
    short = Translator(
        translator.engine, translator.tokenizers, dataclasses.replace(translator.decode, max_input_tokens=6), translator.normalize
    )
    letters = "a b c d e f g h i j k l a b c d".split()
    output = short.translate([" ".join(letters), "a b c"])
    assert short.split_lines == 1
    expected = " ".join(" ".join(reversed(letters[i : i + 6])) for i in range(0, len(letters), 6))
    assert output == [expected, "c b a"]


def test_bad_bytes_in_translate_input_can_be_replaced(reverse_run):
    from typer.testing import CliRunner

    from mtkit.cli import app

    arguments = ["translate", "-m", str(reverse_run.run_path), "--beam", "1"]
    refused = CliRunner().invoke(app, arguments, input=b"a b c\nd \xff e\n")
    assert refused.exit_code == 2 and "<stdin>:2: not valid UTF-8" in refused.stderr
    replaced = CliRunner().invoke(app, [*arguments, "--bad-bytes", "replace"], input=b"a b c\nd \xff e\n")
    assert replaced.exit_code == 0
    assert replaced.stdout.splitlines()[0] == "c b a" and len(replaced.stdout.splitlines()) == 2
    assert "replaced bytes that are not UTF-8 on 1 lines" in replaced.stderr
