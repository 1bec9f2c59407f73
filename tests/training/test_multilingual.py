"""Multilingual recipes without training: target-language tags, temperature sampling, the keys refused at
load, search never emitting a tag, and the off-target rate (trained: tests/integration/training/)."""

from __future__ import annotations

import pytest

from mtkit.config import config_from_dict, load_config, tag_languages, target_languages
from mtkit.data.tokenizer import tag_piece, tagged, train_sentencepiece
from mtkit.decoding.search import NEVER_EMITTED, SearchOptions, greedy_search
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
    found = greedy_search(
        Stub(), src, src_mask=src.ne(0), max_len=torch.tensor([6]), options=SearchOptions(never=(*NEVER_EMITTED, 4))
    )
    assert 4 not in found[0].tokens and found[0].tokens


def test_off_target_rate_counts_outputs_in_another_language():
    pytest.importorskip("py3langid")
    from mtkit.evaluation.language import off_target_rate

    outputs = ["Ein Hund läuft über die Wiese.", "A dog runs across the meadow.", "Un chien court dans le pré.", ""]
    assert off_target_rate(outputs, "en", candidates=["de", "en", "fr"]) == pytest.approx(200 / 3)
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
