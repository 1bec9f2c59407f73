"""Tags placed by eflomal guided by a run's word priors (`documents.aligner`): finer than words, learnt from the
corpus rather than read from attention, and a priors file checked before it is used."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from mtkit.config import DecodeConfig
from mtkit.data.word_alignment import corpus_priors
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translation
from mtkit.documents import aligner as aligner_module
from mtkit.documents.aligner import TagAligner, aligner_of, load_priors, save_priors
from mtkit.documents.blocks import Block, Span
from mtkit.documents.formats import DocumentLimits, format_named, read_document
from mtkit.documents.pipeline import translate_blocks
from mtkit.documents.tags import markup, place_spans, tokens
from mtkit.errors import MtkitError


def test_tokens_split_a_word_from_its_punctuation_and_a_tag_on_hut_goes_around_hat_not_its_comma() -> None:
    source = Block(text="Ein Hut, rot.", spans=(Span(start=4, end=7, open="<b>", close="</b>"),))
    assert [source.text[a:b] for a, b in tokens(source.text)] == ["Ein", "Hut", ",", "rot", "."]
    translation = Translation(text="A hat, red.", score=0.0, tokens=[])
    placed = place_spans(source, translation, token_links=[(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)])
    assert markup(placed, escape=str) == "A <b>hat</b>, red."


def made_up_corpus(pairs: int) -> tuple[list[str], list[str]]:
    """A language whose word `wN` translates as `tN`, written in reverse order."""
    rng = random.Random(3)
    lines = [rng.sample(range(30), rng.randint(3, 7)) for _ in range(pairs)]
    return [" ".join(f"w{n}" for n in line) for line in lines], [" ".join(f"t{n}" for n in reversed(line)) for line in lines]


class UnalignedReverser:
    """A stand-in model translating the made-up language, with no alignment of its own: only an aligner can place
    tags over its output."""

    def __init__(self, directory: Path | None) -> None:
        self.directory, self.decode, self.config = directory, DecodeConfig(), None
        self.asked: list[Decoding] = []

    def translate_nbest(self, texts: Sequence[str], decoding: Decoding, **_: object) -> list[list[Translation]]:
        self.asked.append(decoding)
        return [[Translation(text=" ".join("t" + w[1:] for w in reversed(text.split())), score=0.0, tokens=[])] for text in texts]


@pytest.fixture
def priors_run(tmp_path: Path) -> Path:
    pytest.importorskip("eflomal")
    save_priors(tmp_path / "word_priors.txt", corpus_priors(*made_up_corpus(300)), info={"lines": 300})
    return tmp_path


def test_the_runs_priors_place_each_tag_over_the_translation_of_its_words(priors_run: Path) -> None:
    page = "<p>w4 <b>w11</b> w20 <i>w7 w2</i></p><p><a href='x'>w9</a> w1 w0</p>"
    document = read_document(format_named("html"), page, name="page", limits=DocumentLimits())
    model = UnalignedReverser(priors_run)
    written = document.render(translate_blocks(model, document.blocks, decoding=Decoding()))
    assert written == '<p><i>t2 t7</i> t20 <b>t11</b> t4</p><p>t0 t1 <a href="x">t9</a></p>'
    assert not any(decoding.alignments for decoding in model.asked)  # the model's attention was not asked for


def test_without_priors_the_translations_alignment_places_tags(tmp_path: Path) -> None:
    assert aligner_of(tmp_path) is None and aligner_of(None) is None
    document = read_document(format_named("html"), "<p>w1 <b>w2</b></p>", name="page", limits=DocumentLimits())
    model = UnalignedReverser(tmp_path)
    translate_blocks(model, document.blocks, decoding=Decoding())
    assert model.asked[0].alignments  # asked of the model, as no aligner is at hand


def test_a_call_hands_eflomal_the_priors_of_its_own_words_alone(priors_run: Path) -> None:
    aligner = load_priors(priors_run / "word_priors.txt")
    text = aligner.priors_for([["w3", "w4"]], [["t4", "t3"]])
    lexical = [line.split("\t")[1:3] for line in text.splitlines() if line.startswith("LEX")]
    assert ["w3", "t3"] in lexical and all(s in ("w3", "w4") and t in ("t3", "t4") for s, t in lexical)
    assert "HMMF" in text and "FERF\tw3\t" in text and "FERF\tw5\t" not in text


def test_a_bad_or_oversized_priors_file_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "word_priors.txt"
    bad.write_text("LEX\ta\tb\t1\nnot a prior\n", encoding="utf-8")
    with pytest.raises(
        MtkitError, match=r"word_priors.txt, line 2: 'not a prior' is not a line of eflomal's priors; build it"
    ) as caught:
        load_priors(bad)
    assert "\n" not in str(caught.value)
    monkeypatch.setattr(aligner_module, "MOST_BYTES", 10)
    with pytest.raises(MtkitError, match=r"word_priors.txt: 22 bytes, more than the 10 such a file may hold"):
        load_priors(bad)
    assert isinstance(TagAligner.read("", path=bad), TagAligner)
