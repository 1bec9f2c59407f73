"""`mtkit serve` over an imported NLLB-200 model: a request names the source's and the target's language codes
(`src_lang`, `tgt_lang`), /info lists the codes, and a code the model lacks is a 400 naming the closest."""

from __future__ import annotations

from pathlib import Path

import pytest
from fairseq_builder import build
from helpers import request, serving

from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.importers import import_model
from mtkit.serving.limits import ServeLimits

pytest.importorskip("transformers")

SOURCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Gras."]


def test_requests_name_their_language_codes(tmp_path: Path) -> None:
    built = build("nllb", tmp_path / "hf")
    import_model(str(built.folder), tmp_path / "run")
    translator = Translator.load(tmp_path / "run")
    with serving(translator, ServeLimits(max_wait_ms=0)) as (port, _):
        info = request(port, "GET", "/info").body
        assert set(built.tgt_langs) <= set(info["target_languages"]) and info["source_language"] == built.src_lang
        for lang in built.tgt_langs:
            reply = request(port, "POST", "/translate", {"text": SOURCES, "beam": 1, "src_lang": "de", "tgt_lang": lang})
            expected = translator.translate_nbest(SOURCES, Decoding(beam=1, src_lang="deu_Latn", tgt_lang=lang))
            assert reply.status == 200 and reply.body["translations"] == [found[0].text for found in expected]
        refused = request(port, "POST", "/translate", {"text": SOURCES, "tgt_lang": "frx_Latn"})
    assert refused.status == 400 and "tgt_lang frx_Latn" in refused.body["detail"] and "fra_Latn" in refused.body["detail"]
