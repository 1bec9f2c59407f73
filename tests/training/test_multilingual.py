"""Multilingual recipes: target-language tags, temperature sampling, per-direction validation and
evaluation, and the target language chosen at translation time (--tgt-lang).

The trained fixture (`tagged_run`, in conftest.py) is the reverse task with two "languages": `cp`
(the target is the source) and `rv` (the target is the source reversed), the same sources under
both tags, so only the tag can tell the model which to do.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke, request, serving, succeeded, translate

from mtkit.config import config_from_dict, load_config, tag_languages, target_languages
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import tag_piece, tagged, train_sentencepiece
from mtkit.decoding.search import NEVER_EMITTED, SearchOptions, greedy_search
from mtkit.decoding.translator import Decoding, Translator
from mtkit.errors import MtkitError
from mtkit.training.batches import temperature_weights


def test_a_tag_is_one_reserved_piece_that_text_never_produces():
    sentences = ["a b c <2fr> d e", "<2de> f g h"] * 50
    tokenizer = train_sentencepiece(sentences, 40, tag_langs=["de", "fr"])
    assert tokenizer.tags == {"de": 4, "fr": 5}  # fixed ids: right after the four special pieces, in order
    assert tokenizer.id_to_piece([4, 5]) == [tag_piece("de"), tag_piece("fr")]
    for text in ("<2fr>", "x <2de> y", "<2fr>a"):
        assert not set(tokenizer.encode(text)) & {4, 5}, text  # typed by a user, a tag is ordinary text
    assert tokenizer.decode([5, *tokenizer.encode("a b")]) == "a b"  # decoding drops the tag
    assert train_sentencepiece(sentences, 40).tags == {}  # an untagged recipe reserves nothing


def test_tagged_puts_the_tag_first_in_every_row():
    assert tagged([[7, 8], []], 4) == [[4, 7, 8], [4]]
    assert tagged([[7, 8], [9]], [4, None]) == [[4, 7, 8], [9]]
    assert tagged([[7]], None) == [[7]]


def test_the_temperature_weights_follow_the_formula_for_a_worked_example():
    # Sizes 100,000 and 10,000 at T = 5: shares 100000^0.2 = 10 and 10000^0.2 = 6.31, so of the
    # 110,000 pairs an epoch the large corpus gives 110000 x 10 / 16.3096 = 67,445 and the small 42,555.
    weights = temperature_weights([100_000, 10_000], 5.0)
    drawn = [weight * size for weight, size in zip(weights, [100_000, 10_000], strict=True)]
    assert drawn[0] == pytest.approx(110_000 * 10 / (10 + 10**0.8), rel=1e-9)
    assert drawn[0] == pytest.approx(67_445, abs=1)
    assert sum(drawn) == pytest.approx(110_000)
    assert temperature_weights([100_000, 10_000], 1.0) == pytest.approx([1.0, 1.0])  # T = 1: the sizes as they are
    flat = temperature_weights([100_000, 10_000], 100.0)
    assert flat[0] * 100_000 / (flat[1] * 10_000) == pytest.approx(10 ** (1 / 100))  # large T: nearly equal


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("data.lang_tag=source", "'data.lang_tag' is 'source'; choose one of none, target"),
        ("data.langs=de;fr", "'data.langs' is 'de;fr'; give language codes separated by commas"),
        ("data.corpus_temperature=0.5", "'data.corpus_temperature' is 0.5; give a number in [1, 100]"),
        ("data.corpus_temperature=.nan", "'data.corpus_temperature' is nan"),
        ("tgt_lang=English", "'tgt_lang' is 'English'; give a language code"),
        ("data.valid[1].tgt_lang=FR", "'data.valid[1].tgt_lang' is 'FR'; give a language code"),
    ],
)
def test_every_new_key_is_refused_at_load_in_one_line(tmp_path, override, needle):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "data:\n  lang_tag: target\n  train: {src: a, tgt: b}\n  valid: [{src: a, tgt: b}, {src: a, tgt: b, tgt_lang: fr}]\n",
        encoding="utf-8",
    )
    with pytest.raises(MtkitError) as caught:
        load_config(recipe, [override])
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_several_targets_need_tags_and_a_temperature_excludes_weights(tmp_path):
    two = [{"src": "a", "tgt": "b", "tgt_lang": "fr"}, {"src": "a", "tgt": "b", "tgt_lang": "de", "weight": 2.0}]
    with pytest.raises(MtkitError, match="translate into fr, de; set data.lang_tag=target"):
        config_from_dict({"data": {"train": two}})
    with pytest.raises(MtkitError, match="give either data.corpus_temperature or weights, not both"):
        config_from_dict({"data": {"train": two, "lang_tag": "target", "corpus_temperature": 5}})
    config = config_from_dict({"src_lang": "en", "data": {"train": two[:1], "lang_tag": "target", "langs": "it, es"}})
    assert target_languages(config) == ["fr"]
    assert tag_languages(config) == ["en", "es", "fr", "it", "tgt"]


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


def test_search_never_emits_a_tag():
    class Stub:  # a decoder whose most probable next token is always the tag 4
        max_positions = 16

        def encode(self, src, src_mask):
            return src.float().unsqueeze(2)

        def decode(self, tokens, memory, src_mask, state):
            import torch

            logits = torch.zeros(tokens.size(0), 1, 10)
            logits[:, 0, 4] = 10.0
            return logits, {}

        def reorder_state(self, state, keep):
            return state

    import torch

    src = torch.tensor([[5, 6, 3]])
    found = greedy_search(Stub(), src, src.ne(0), torch.tensor([6]), SearchOptions(never=(*NEVER_EMITTED, 4)))
    assert 4 not in found[0].tokens and found[0].tokens


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


def test_off_target_rate_counts_outputs_in_another_language():
    pytest.importorskip("py3langid")
    from mtkit.evaluation.language import off_target_rate

    outputs = ["Ein Hund läuft über die Wiese.", "A dog runs across the meadow.", "Un chien court dans le pré.", ""]
    assert off_target_rate(outputs, "en", ["de", "en", "fr"]) == pytest.approx(200 / 3)
    assert off_target_rate(outputs[1:2], "en") == 0.0
    with pytest.raises(MtkitError, match="not one py3langid identifies"):
        off_target_rate(outputs, "xx")


def test_off_target_without_py3langid_says_how_to_install_it(monkeypatch):
    import builtins

    from mtkit.evaluation import language

    real_import = builtins.__import__

    def no_langid(name, *args, **kwargs):
        if name.startswith("py3langid"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_langid)
    with pytest.raises(MtkitError, match=r"pip install 'mtkit\[langid\]'"):
        language.off_target_rate(["a"], "en")


def test_the_server_takes_the_target_language_per_request(tagged_run):
    from mtkit.serving.app import ServeLimits

    with serving(Translator.load(tagged_run.run_path), ServeLimits()) as (port, _):
        info = request(port, "GET", "/info").body
        assert info["target_languages"] == ["cp", "rv"] and info["needs_tgt_lang"]
        assert translate(port, ["a b c"], tgt_lang="rv").body["translations"] == ["c b a"]
        assert translate(port, ["a b c"], tgt_lang="cp").body["translations"] == ["a b c"]
        missing = translate(port, ["a b c"])
        assert missing.status == 400 and "translates into cp, rv" in missing.body["detail"]
        unknown = translate(port, ["a b c"], tgt_lang="de")
        assert unknown.status == 400 and "cp, rv only" in unknown.body["detail"]


def test_the_ctranslate2_export_keeps_the_tag_as_a_source_piece(tagged_run, tmp_path):
    pytest.importorskip("ctranslate2")
    from mtkit.exporters.ctranslate2 import export_ctranslate2

    exported = export_ctranslate2(tagged_run.run_path, tmp_path / "ct2", None)
    ct2, torch_model = Translator.load(exported), Translator.load(tagged_run.run_path)
    assert ct2.engine.name == "ctranslate2" and ct2.target_languages == ["cp", "rv"]
    lines = ["a b c d", "e f g"]
    for lang in ("cp", "rv"):
        assert ct2.translate(lines, tgt_lang=lang) == torch_model.translate(lines, tgt_lang=lang)
    with pytest.raises(MtkitError, match="translates into cp, rv"):
        ct2.translate(lines)
