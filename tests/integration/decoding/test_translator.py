"""The translation engine: one output per input, in order, whatever the batching."""

from __future__ import annotations

import dataclasses

import pytest

from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator


def test_outputs_keep_input_order_across_many_small_batches(reverse_pytorch):
    lines = ["a b c", "", "d e f g h i j", "k l", "   ", "a", "b c d e f"]
    one_by_one = [reverse_pytorch.translate([line])[0] for line in lines]
    tiny_batches = Translator(
        reverse_pytorch.engine,
        reverse_pytorch.tokenizers,
        decode=dataclasses.replace(reverse_pytorch.decode, batch_beam_tokens=10),
        normalize=reverse_pytorch.normalize,
    )
    assert tiny_batches.translate(lines) == one_by_one
    assert reverse_pytorch.translate(lines) == one_by_one
    assert one_by_one[1] == "" and one_by_one[4] == ""
    assert one_by_one[0] == "c b a"


def test_nbest_returns_ranked_distinct_hypotheses(reverse_pytorch):
    results = reverse_pytorch.translate_nbest(["a b c d", "e f"], Decoding(beam=4, nbest=3))
    assert [len(r) for r in results] == [3, 3]
    for hypotheses in results:
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hypotheses}) == 3
    assert results[0][0].text == "d c b a"


def test_beam_one_equals_greedy_output(reverse_pytorch):
    lines = ["a b c", "l k j i h", "g"]
    assert reverse_pytorch.translate(lines, beam=1) == [
        h[0].text for h in reverse_pytorch.translate_nbest(lines, Decoding(beam=1))
    ]


def test_input_is_normalised_like_training_data(reverse_pytorch):
    assert reverse_pytorch.translate(["a\u0301 b"])[0] == reverse_pytorch.translate(["\u00e1 b"])[0]


def test_output_length_is_capped_by_max_len(reverse_pytorch):
    capped = Translator(
        reverse_pytorch.engine,
        reverse_pytorch.tokenizers,
        decode=dataclasses.replace(reverse_pytorch.decode, max_len_a=0.0, max_len_b=2),
        normalize=reverse_pytorch.normalize,
    )
    for hypothesis in capped.translate_nbest(["a b c d e f g"], Decoding(beam=2))[0]:
        assert len(hypothesis.tokens) <= 2


def test_very_long_input_is_translated_to_one_line(reverse_pytorch):
    output = reverse_pytorch.translate([" ".join("abcdefghijkl" * 60)])
    assert len(output) == 1 and isinstance(output[0], str)


def test_over_long_lines_are_translated_in_segments(reverse_pytorch):
    short = Translator(
        reverse_pytorch.engine,
        reverse_pytorch.tokenizers,
        decode=dataclasses.replace(reverse_pytorch.decode, max_input_tokens=6),
        normalize=reverse_pytorch.normalize,
    )
    letters = "a b c d e f g h i j k l a b c d".split()
    output = short.translate([" ".join(letters), "a b c"])
    assert short.plan([" ".join(letters), "a b c"]).split_lines == 1
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


def test_a_line_over_the_cap_stops_translate_with_one_line_and_exit_2(reverse_run, monkeypatch):
    from typer.testing import CliRunner

    from mtkit.cli import app

    monkeypatch.setattr("mtkit.textio.MAX_LINE_BYTES", 100)
    result = CliRunner().invoke(app, ["translate", "-m", str(reverse_run.run_path), "--beam", "1"], input=b"a b\n" + b"c " * 60)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert (
        result.stderr == "mtkit: error: <stdin>:2: a line of more than 100 bytes; split it into lines of at most that size "
        "(a sentence or a paragraph a line)\n"
    )


def test_small_windows_give_the_same_output_as_one_window(reverse_run, tmp_path):
    from typer.testing import CliRunner

    from mtkit.cli import app

    lines = ["a b c", "", "d e f g h i j", "k l", "a", "b c d e f", "g h"] * 3
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    outputs = {}
    for window in (1, 4, 10_000):
        target = tmp_path / f"out{window}.txt"
        arguments = ["translate", "-m", str(reverse_run.run_path), "-i", str(source), "-o", str(target), "--nbest", "2"]
        result = CliRunner().invoke(app, [*arguments, "--buffer-lines", str(window)])
        assert result.exit_code == 0, result.output
        outputs[window] = target.read_text(encoding="utf-8")
    # Windows batch the lines differently, so a score may differ in its last bits (and its fourth decimal).
    texts, scores = {}, {}
    for window, output in outputs.items():
        fields = [line.split("\t") for line in output.splitlines()]
        texts[window], scores[window] = [f[0::2] for f in fields], [[float(x) for x in f[1::2]] for f in fields]
    assert texts[1] == texts[4] == texts[10_000]
    for window in (4, 10_000):
        assert sum(scores[window], []) == pytest.approx(sum(scores[1], []), abs=2e-4)
    assert len(outputs[1].splitlines()) == len(lines)


def test_a_failed_translation_leaves_the_previous_output_file_intact(reverse_run, tmp_path):
    from typer.testing import CliRunner

    from mtkit.cli import app

    target = tmp_path / "out.txt"
    target.write_text("earlier output\n", encoding="utf-8")
    source = tmp_path / "in.txt"
    source.write_bytes(b"a b c\nd e\nf \xff g\n")
    arguments = ["translate", "-m", str(reverse_run.run_path), "-i", str(source), "-o", str(target), "--buffer-lines", "1"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2 and f"{source}:3: not valid UTF-8" in result.stderr
    assert target.read_text(encoding="utf-8") == "earlier output\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # no temporary file left
