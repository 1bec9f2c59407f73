"""Problem flags: loops, copies, empty, runaway and truncated outputs, and the rules that set them."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtkit.errors import MtkitError
from mtkit.evaluation.problems import FlagRules, flag_corpus, parse_rules
from mtkit.textio import read_lines

SYSTEMS = Path(__file__).resolve().parents[1] / "fixtures" / "systems"


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
    flags = flag_corpus(hypotheses, references, sources=sources, rules=FlagRules())
    assert {n: found for n, found in enumerate(flags) if found} == {5: ["loop"], 17: ["copy"], 42: ["empty"]}


def test_runaway_and_truncated_outputs_are_flagged_by_length():
    sources = ["ein kleiner Hund läuft über die grüne Wiese"] * 3
    references = ["a small dog runs across the green meadow"] * 3
    hypotheses = [references[0], "a dog", references[0] + " while a man watches from a bench in the park near the lake"]
    assert flag_corpus(hypotheses, references, sources=sources, rules=FlagRules()) == [[], ["too_short"], ["too_long"]]
    stutter = flag_corpus(["People are assembembembembembled."], ["People are assembling."], sources=None, rules=FlagRules())
    assert stutter == [["loop"]]


def test_without_references_lengths_are_judged_by_the_outputs_own_ratio_to_the_sources():
    sources = ["der Hund bellt"] * 10
    hypotheses = ["the dog barks"] * 9 + ["the dog barks and barks at the cat all day long"]
    assert flag_corpus(hypotheses, None, sources=sources, rules=FlagRules()) == [[]] * 9 + [["too_long"]]


@pytest.mark.parametrize(
    ("rule", "message"),
    [("loops=3", "unknown threshold 'loops'"), ("loop_count=x", "'x' is not a number"), ("length_band=0", "give a number > 0")],
)
def test_a_bad_flag_rule_is_one_clear_error(rule, message):
    with pytest.raises(MtkitError, match=message):
        parse_rules([rule])
    assert parse_rules(["loop_count=4", "copy_ratio=0.9"]) == FlagRules(loop_count=4, copy_ratio=0.9)
