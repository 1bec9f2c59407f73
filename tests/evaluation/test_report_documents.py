"""mtkit evaluate --format: tagged hypotheses and sources scored without their markup; a bad line refused in one line."""

from __future__ import annotations

import json

import pytest
from helpers import assert_one_line_error, cli_output, invoke, write_text_lines

SENTENCES = ["a dog runs through the snow .", "two men & a boy play < football ."]


def test_tagged_hypotheses_score_as_their_plain_text(tmp_path):
    refs = write_text_lines(tmp_path / "ref.txt", SENTENCES)
    tagged = write_text_lines(
        tmp_path / "hyp.html",
        ["<p>a <b>dog</b> runs through the <a href='x'>snow</a> .</p>", "two men &amp; a boy play &lt; <i>football</i> ."],
    )
    plain = json.loads(cli_output("evaluate", "--hyp", tagged, "--ref", refs, "--format", "html", "--json"))
    assert plain["scores"]["BLEU"]["score"] == pytest.approx(100.0)
    raw = json.loads(cli_output("evaluate", "--hyp", tagged, "--ref", refs, "--json"))
    assert raw["scores"]["BLEU"]["score"] < 100.0


def test_a_line_that_is_not_its_format_is_one_line(tmp_path):
    refs = write_text_lines(tmp_path / "ref.txt", SENTENCES)
    hyps = write_text_lines(tmp_path / "hyp.xml", ["<s>a dog</s>", "<s>two men</t>"])
    assert_one_line_error(invoke("evaluate", "--hyp", hyps, "--ref", refs, "--format", "xml"), f"--hyp {hyps} line 2:1:")
