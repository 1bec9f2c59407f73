"""The language codes of an imported NLLB-200, M2M-100 or mBART-50 model (`data.lang_tag: code`): how a name
(deu_Latn, de for M2M-100's __de__, or an ISO 639-1 code) picks one of them, and the new codes a fine-tuning
recipe adds (`data.new_languages`).

Here, below the stages that read names (prepare writes each corpus's codes, translate forces them), so that a
corpus's src_lang/tgt_lang and `--src-lang`/`--tgt-lang` name a code by one rule.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from mtkit.data.tokenizer import LANGUAGE_CODE
from mtkit.errors import MtkitError, OptionError

MEAN = "mean"  # data.new_languages' value for a row started as the mean of every language code's row
# ISO 639-1 -> the ISO 639-3 code NLLB-200 writes it with (its macrolanguages by their main member: ar -> arb)
ISO_639_3 = dict(
    pair.split(":")
    for pair in (
        "af:afr am:amh ar:arb as:asm az:azj be:bel bg:bul bn:ben bo:bod bs:bos ca:cat cs:ces cy:cym da:dan de:deu el:ell "
        "en:eng eo:epo es:spa et:est eu:eus fa:pes fi:fin fj:fij fo:fao fr:fra ga:gle gd:gla gl:glg gn:grn gu:guj ha:hau "
        "he:heb hi:hin hr:hrv ht:hat hu:hun hy:hye id:ind ig:ibo is:isl it:ita ja:jpn jv:jav ka:kat kk:kaz km:khm kn:kan "
        "ko:kor ku:kmr ky:kir lb:ltz lg:lug ln:lin lo:lao lt:lit lv:lvs mg:plt mi:mri mk:mkd ml:mal mn:khk mr:mar ms:zsm "
        "mt:mlt my:mya nb:nob ne:npi nl:nld nn:nno no:nob ny:nya oc:oci om:gaz or:ory pa:pan pl:pol ps:pbt pt:por ro:ron "
        "ru:rus rw:kin sd:snd si:sin sk:slk sl:slv sm:smo sn:sna so:som sq:als sr:srp st:sot su:sun sv:swe sw:swh ta:tam "
        "te:tel tg:tgk th:tha ti:tir tk:tuk tl:tgl tn:tsn tr:tur ts:tso tt:tat ug:uig uk:ukr ur:urd uz:uzn vi:vie wo:wol "
        "xh:xho yi:ydd yo:yor zh:zho zu:zul"
    ).split()
)


def code_id(codes: Mapping[str, int], name: str, *, option: str) -> int:
    """The id of the code `name` gives (`option`: the flag, for the error): the code itself, or the one code of
    that ISO 639-1 or 639-3 language; none, or several, is one line naming the closest codes."""
    if name in codes:
        return codes[name]
    language = name.replace("-", "_").split("_")[0].lower()
    matching = [code for code in codes if code.split("_")[0] in (language, ISO_639_3.get(language))]
    if len(matching) == 1:
        return codes[matching[0]]
    flag = "{" + option + "}"
    if matching:
        raise OptionError(
            option, flag + " {value} names several of the model's codes: {codes}; give one", value=name, codes=", ".join(matching)
        )
    closest = ", ".join(difflib.get_close_matches(name, list(codes), n=4, cutoff=0.0))
    raise OptionError(
        option, flag + " {value}: the model has no such language code; the closest it has: {codes}", value=name, codes=closest
    )


def recipe_code_id(codes: Mapping[str, int], name: str, *, key: str) -> int:
    """`code_id` for a name the recipe gives at `key` (data.train.tgt_lang): its error names the key, not a flag."""
    try:
        return code_id(codes, name, option="lang")
    except OptionError as err:
        raise MtkitError(err.worded(lambda _: key)) from None


def new_languages(text: str) -> dict[str, str]:
    """`data.new_languages` ("xyz_Latn=fra_Latn, abc_Latn=mean") as {new code: the code whose row it starts from,
    or `MEAN`}; the recipe checker has checked its form."""
    pairs = [item.split("=") for item in text.replace(" ", "").split(",") if item]
    return {new: source for new, source in pairs}


def code_piece(name: str, codes: Mapping[str, int], *, pieces: list[str]) -> str:
    """The table piece of a new code `name` in the form of the model's codes: __xx__ for M2M-100's, else the name."""
    return f"__{name}__" if any(pieces[index].startswith("__") for index in codes.values()) else name


def added_code_pieces(new: Mapping[str, str], codes: Mapping[str, int], *, pieces: list[str]) -> list[str]:
    """The table pieces of the new codes `new` (`new_languages`), checked against the model's `codes` and table
    `pieces`: a code it has, a name not of its codes' form, or a code to start from that it lacks is one line."""
    example = next(iter(codes), "deu_Latn")
    added = []
    for name, source in new.items():
        piece = code_piece(name, codes, pieces=pieces)
        if name in codes or piece in pieces:
            raise MtkitError(
                f"data.new_languages {name}: the model has this language code already; remove it from "
                "data.new_languages and name it in the corpora as it is"
            )
        if not LANGUAGE_CODE.fullmatch(piece) or (name.count("_") != example.count("_")):
            raise MtkitError(
                f"data.new_languages {name}: not a language code of the model's form; name it as the model names its "
                f"codes, such as {example}"
            )
        if source != MEAN:
            recipe_code_id(codes, source, key="data.new_languages")
        added.append(piece)
    return added


def start_rows(new: Mapping[str, str], codes: Mapping[str, int], *, pieces: list[str]) -> dict[str, list[int]]:
    """Each new code's piece -> the parent's ids whose rows' mean its rows start from: its named code's, or with
    `MEAN` every code's."""
    return {
        code_piece(name, codes, pieces=pieces): list(codes.values())
        if source == MEAN
        else [code_id(codes, source, option="lang")]
        for name, source in new.items()
    }
