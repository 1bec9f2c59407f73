"""Language codes on the command line: a model's own code, or an ISO 639-1 code where it names one code only;
otherwise one line naming the closest codes the model has."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mtkit.config import config_from_dict
from mtkit.decoding.languages import Languages, code_id
from mtkit.errors import OptionError

NLLB = {"deu_Latn": 10, "eng_Latn": 11, "fra_Latn": 12, "zho_Hans": 13, "zho_Hant": 14, "arb_Arab": 15}
M2M100 = {"de": 20, "en": 21, "fr": 22}  # __de__ is named de
MBART = {"de_DE": 30, "en_XX": 31, "fr_XX": 32}


@pytest.mark.parametrize(
    ("codes", "name", "expected"),
    [
        (NLLB, "deu_Latn", 10),
        (NLLB, "de", 10),  # ISO 639-1 -> NLLB's ISO 639-3
        (NLLB, "deu", 10),
        (NLLB, "ar", 15),  # a macrolanguage by NLLB's member: ar -> arb
        (M2M100, "fr", 22),
        (MBART, "de", 30),
        (MBART, "fr_XX", 32),
    ],
)
def test_a_code_or_the_one_code_of_a_language(codes: dict[str, int], name: str, expected: int) -> None:
    assert code_id(codes, name, option="tgt_lang") == expected


def test_several_codes_of_a_language_are_one_line_listing_them() -> None:
    with pytest.raises(OptionError, match=r"--tgt-lang zh names several of the model's codes: zho_Hans, zho_Hant; give one"):
        code_id(NLLB, "zh", option="tgt_lang")


def test_a_code_the_model_lacks_is_one_line_naming_the_closest() -> None:
    with pytest.raises(OptionError) as raised:
        code_id(NLLB, "dex_Latn", option="src_lang")
    message = str(raised.value)
    assert message.startswith("--src-lang dex_Latn: the model has no such language code; the closest it has: deu_Latn")
    assert "\n" not in message
    assert raised.value.worded(str).startswith("src_lang dex_Latn")  # the server's wording


def test_a_source_language_that_a_model_without_codes_cannot_be_told_is_one_line() -> None:
    languages = Languages(config_from_dict({"src_lang": "de", "tgt_lang": "en"}), SimpleNamespace())
    assert languages.leads("de", None) == (None, [])  # the language it reads: nothing to tell it
    with pytest.raises(OptionError) as raised:
        languages.leads("zz", None)
    message = raised.value.worded(str)  # the server's wording
    assert message.startswith("src_lang zz: this model has no language codes") and "(it reads de)" in message
    assert "\n" not in message and "leave src_lang out" in message
