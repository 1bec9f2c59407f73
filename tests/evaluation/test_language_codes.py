"""The off-target rate's language identifier knows ISO 639-1 codes: a model's own code is read as one."""

from __future__ import annotations

import pytest

from mtkit.evaluation.language import base_language


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("fr", "fr"),
        ("pt_BR", "pt"),
        ("zh-Hant", "zh"),
        ("fra_Latn", "fr"),
        ("zho_Hans", "zh"),
        ("arb_Arab", "ar"),
        ("fr_XX", "fr"),
    ],
)
def test_a_models_language_code_is_its_iso_639_1_code(code: str, expected: str) -> None:
    assert base_language(code) == expected
