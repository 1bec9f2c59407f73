"""Off-target translations: the share of outputs not written in the language asked for (`mtkit evaluate --off-target`).

The language of each output is identified by py3langid, which ships its model inside its package
(no download; `pip install 'mtkit[langid]'`), among the languages the model knows when they are
given (so that a short caption is not put down to a language nobody asked for), else among all 97.
Empty outputs are not counted.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any

from mtkit.data.language_codes import ISO_639_3
from mtkit.errors import MtkitError, OptionError

ISO_639_1 = {three: two for two, three in ISO_639_3.items() if two != "no"}  # NLLB-200's codes: nob -> nb


def off_target_rate(hypotheses: Sequence[str], lang: str, *, candidates: Sequence[str] = ()) -> float:
    """The percentage of non-empty `hypotheses` whose identified language is not `lang`."""
    identifier = language_identifier("--off-target")
    known = set(identifier.nb_classes)
    code = base_language(lang)
    if code not in known:
        raise OptionError(
            "off_target",
            "{off_target}: language {lang!r} is not one py3langid identifies; give an ISO 639-1 code such as fr",
            lang=lang,
        )
    chosen = sorted({base_language(c) for c in candidates} & known | {code})
    if len(chosen) > 1:
        identifier.set_languages(chosen)
    outputs = [text for text in hypotheses if text.strip()]
    off = sum(identifier.classify(text)[0] != code for text in outputs)
    return 100.0 * off / max(len(outputs), 1)


def base_language(lang: str) -> str:
    """pt_BR -> pt, zh-Hant -> zh, an NLLB-200 code fra_Latn -> fr: the code py3langid uses."""
    base = lang.replace("-", "_").split("_")[0].lower()
    return ISO_639_1.get(base, base)


def language_identifier(needed_by: str) -> Any:
    """py3langid's identifier over all its languages, a copy of its own (`set_languages` changes only it) of the
    one loaded once a process; without the `langid` extra, one line naming `needed_by`."""
    try:
        import py3langid.langid  # noqa: F401  its model ships in the package
    except ImportError:
        raise MtkitError(
            f"{needed_by} needs the language identifier py3langid: pip install 'mtkit[langid]' (or pip install py3langid)"
        ) from None
    return copy.copy(_loaded_identifier())


@functools.cache
def _loaded_identifier() -> Any:
    """py3langid's model, read and decompressed once: `set_languages` replaces an identifier's tables (never
    changes them in place), so each copy of this one can narrow its own languages."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE)
