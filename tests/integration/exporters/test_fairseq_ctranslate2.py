"""`mtkit export --format ctranslate2` of imported NLLB-200, M2M-100 and mBART-50 models (fairseq's positions, mBART's
LayerNorm on the embeddings, unscaled embeddings): the CTranslate2 engine gives the PyTorch engine's greedy tokens and
scores of a reference for two target languages, through the library and `mtkit translate`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fairseq_builder import Built, build
from helpers import cli_output

from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")

SOURCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Gras.", "Kinder!", "Eine Frau sitzt auf einer Bank im Park."]


@dataclasses.dataclass(frozen=True)
class Engines:
    built: Built  # the family's model as built (its languages)
    pytorch: Translator  # over the import
    ctranslate2: Translator  # over its export
    run: Path
    export: Path


@pytest.fixture(scope="module", params=["nllb", "m2m100", "mbart"])
def engines(request, tmp_path_factory: pytest.TempPathFactory) -> Engines:
    root = tmp_path_factory.mktemp(request.param)
    built = build(request.param, root / "hf")
    cli_output("import", "auto", str(built.folder), "-o", str(root / "run"))
    cli_output("export", "-m", str(root / "run"), "-o", str(root / "ct2"), "--format", "ctranslate2")
    pytorch, ctranslate2 = Translator.load(root / "run"), Translator.load(root / "ct2")
    assert type(ctranslate2.engine).__name__ == "CT2Engine"
    return Engines(built, pytorch, ctranslate2, root / "run", root / "ct2")


def test_greedy_tokens_and_scores_are_the_pytorch_engines(engines: Engines) -> None:
    src_lang = engines.built.src_lang
    for lang in engines.built.tgt_langs:
        options = Decoding(beam=1, tgt_lang=lang, src_lang=src_lang)
        expected = engines.pytorch.translate_nbest(SOURCES, options)
        found = engines.ctranslate2.translate_nbest(SOURCES, options)  # its search scores a hypothesis cut at the cap
        assert [(best.tokens, best.text) for (best,) in found] == [(best.tokens, best.text) for (best,) in expected]
        hypotheses = [found[0].text or "." for found in expected]
        reference = engines.pytorch.score(SOURCES, hypotheses, tgt_lang=lang, src_lang=src_lang)
        scores = engines.ctranslate2.score(SOURCES, hypotheses, tgt_lang=lang, src_lang=src_lang)
        assert [score.tokens for score in scores] == [score.tokens for score in reference]
        assert [score.log_prob for score in scores] == pytest.approx([score.log_prob for score in reference], abs=1e-4)


def test_the_cli_translates_an_export_as_the_run(engines: Engines, tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    flags = ["-i", str(tmp_path / "in.txt"), "--src-lang", engines.built.src_lang, "--tgt-lang", engines.built.tgt_langs[1]]
    for name, model in (("run", engines.run), ("export", engines.export)):
        cli_output("translate", "-m", str(model), *flags, "-o", str(tmp_path / f"{name}.txt"), "--beam", "1")
    assert (tmp_path / "export.txt").read_text(encoding="utf-8") == (tmp_path / "run.txt").read_text(encoding="utf-8")
