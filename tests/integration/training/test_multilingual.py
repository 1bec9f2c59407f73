"""Multilingual training end to end: tagged source ids, per-direction validation and evaluation, and the
target language chosen at translation time (--tgt-lang).

The trained fixture (`tagged_run`, in shared_fixtures.py) is the reverse task with two "languages": `cp`
(the target is the source) and `rv` (the target is the source reversed), the same sources under
both tags, so only the tag can tell the model which to do."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke, succeeded

from mtkit.data.store import load_prepared
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError


def test_training_and_translation_give_byte_identical_source_ids(tagged_run):
    translator = Translator.load(tagged_run.run_path)
    valid = load_prepared(tagged_run.data_path, "valid")
    for row in (0, 1, len(valid) - 1):
        lang = ["cp", "rv"][valid[row]["corpus"]]
        assert translator.segments(valid[row]["src"], translator.language_tag(lang)) == [valid[row]["src_ids"]]
    assert valid[0]["src_ids"][0] == translator.tokenizers.src.tags["cp"]
    train = load_prepared(tagged_run.data_path, "train")
    assert {ids[0] for ids in train["src_ids"]} == {translator.tokenizers.src.tags[lang] for lang in ("cp", "rv")}
    assert "zz" in translator.tokenizers.src.tags  # data.langs: reserved for later


def test_a_segmented_long_line_is_tagged_in_every_segment(tagged_run):
    translator = Translator.load(tagged_run.run_path)
    translator.decode = dataclasses.replace(translator.decode, max_input_tokens=8)
    tag = translator.language_tag("rv")
    segments = translator.segments(" ".join("abcdefghijkl") * 3, tag)
    assert len(segments) > 2
    assert all(segment[0] == tag and tag not in segment[1:] and len(segment) <= 8 for segment in segments)


def test_the_tag_selects_copy_or_reverse_on_held_out_lines(tagged_run):
    translator = Translator.load(tagged_run.run_path)
    sources = [line for line in Path(tagged_run.data.valid[0].src).read_text(encoding="utf-8").splitlines()]
    sources = [line for line in sources if line.split() != line.split()[::-1]]  # a palindrome obeys both
    obeyed = 0
    for lang, operation in (("cp", lambda words: words), ("rv", lambda words: words[::-1])):
        other = (lambda words: words[::-1]) if lang == "cp" else (lambda words: words)
        for source, output in zip(sources, translator.translate(sources, tgt_lang=lang), strict=True):
            words = output.split()
            asked = sum(a == b for a, b in zip(words, operation(source.split()), strict=False))
            obeyed += asked > sum(a == b for a, b in zip(words, other(source.split()), strict=False))
    assert obeyed >= math.ceil(0.99 * 2 * len(sources)), f"{obeyed} of {2 * len(sources)}"


def test_validation_scores_each_direction_and_keeps_the_best_mean(tagged_run):
    records = [json.loads(line) for line in (tagged_run.run_path / "log.jsonl").read_text().splitlines()]
    validations = [record for record in records if "valid_bleu" in record and "step" in record and "valid_loss" in record]
    assert validations
    for record in validations:
        mean = (record["valid_bleu_xx-cp"] + record["valid_bleu_xx-rv"]) / 2
        assert record["valid_bleu"] == pytest.approx(mean, abs=0.011)
        assert 0 <= record["valid_chrf_xx-rv"] <= 100
    epochs = [record for record in records if "direction_pairs" in record]
    assert epochs and set(epochs[0]["direction_pairs"]) == {"xx-cp", "xx-rv"}


def test_a_tagged_model_needs_a_known_target_language(tagged_run, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("a b c\n", encoding="utf-8")
    assert_one_line_error(invoke("translate", "-m", tagged_run.run_path, "-i", source), "translates into cp, rv", "--tgt-lang")
    assert_one_line_error(invoke("translate", "-m", tagged_run.run_path, "-i", source, "--tgt-lang", "fr"), "cp, rv only")
    output = succeeded(invoke("translate", "-m", tagged_run.run_path, "-i", source, "--tgt-lang", "rv")).stdout
    assert output.split() == ["c", "b", "a"]
    scored = succeeded(invoke("score", "-m", tagged_run.run_path, "--src", source, "--tgt", source, "--tgt-lang", "cp"))
    assert float(scored.stdout.split("\t")[0]) > -2.0  # copying is what the cp tag asks for
    assert_one_line_error(invoke("score", "-m", tagged_run.run_path, "--src", source, "--tgt", source), "--tgt-lang")
    with pytest.raises(MtkitError, match="translates into cp, rv"):
        Translator.load(tagged_run.run_path).translate_nbest(["a b"], Decoding())


def test_evaluate_reports_each_direction_the_mean_and_the_off_target_rate(tagged_run):
    report = json.loads(succeeded(invoke("evaluate", "-m", tagged_run.run_path, "--split", "test", "--json")).stdout)
    directions = report["directions"]
    assert list(directions) == ["xx-cp", "xx-rv"]
    assert report["mean"]["bleu"] == pytest.approx(np.mean([d["bleu"] for d in directions.values()]), abs=0.01)
    text = succeeded(invoke("evaluate", "-m", tagged_run.run_path, "--split", "test", "--tgt-lang", "rv")).stdout
    assert "xx-rv: BLEU" in text and "xx-cp" not in text


def test_the_ctranslate2_export_keeps_the_tag_as_a_source_piece(tagged_run, tmp_path):
    pytest.importorskip("ctranslate2")
    from mtkit.exporters.ctranslate2 import export_ctranslate2

    exported = export_ctranslate2(tagged_run.run_path, tmp_path / "ct2", quantization=None)
    ct2, torch_model = Translator.load(exported), Translator.load(tagged_run.run_path)
    assert ct2.engine.name == "ctranslate2" and ct2.target_languages == ["cp", "rv"]
    lines = ["a b c d", "e f g"]
    for lang in ("cp", "rv"):
        assert ct2.translate(lines, tgt_lang=lang) == torch_model.translate(lines, tgt_lang=lang)
    with pytest.raises(MtkitError, match="translates into cp, rv"):
        ct2.translate(lines)
