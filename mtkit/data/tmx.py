"""TMX translation memories as a corpus (`data.train: {tmx: memory.tmx}`): each translation unit's segments in the
recipe's two languages make a pair.

A memory may hold millions of units in many languages, so it is streamed (`lxml.etree.iterparse`), each unit
cleared once read; a segment's inline codes (`<bpt>`, `<ept>`, `<ph>`, `<it>`, `<ut>`: the markup of the document
it came from) are left out and its highlighted text (`<hi>`, `<sub>`) kept. A `xml:lang` of `de-DE` matches the
recipe's `de` (languages are matched by their first subtag when the full code is not there).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

from lxml import etree

from mtkit.errors import MtkitError
from mtkit.textio import open_binary

XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
NATIVE_CODES = {"bpt", "ept", "ph", "it", "ut"}  # what a segment carries of its document's markup, not its text


def read_tmx(path: Path, src_lang: str, *, tgt_lang: str, recipe_key: str) -> Iterator[tuple[str, str]]:
    """(source, target) of each unit that has a segment in both languages, in file order; units without one
    are skipped, and a memory with none at all is an error naming the languages it has."""
    if not path.is_file():
        raise MtkitError(f"{path}: file not found; check {recipe_key} in the recipe")
    found = 0
    seen: set[str] = set()
    for languages in _units(path):
        seen.update(languages)
        source, target = _segment(languages, src_lang), _segment(languages, tgt_lang)
        if source is not None and target is not None:
            found += 1
            yield source, target
    if not found:
        codes = ", ".join(sorted(seen)) or "none"
        raise MtkitError(
            f"{path}: no translation unit has segments in both {src_lang} and {tgt_lang} (the memory's languages: "
            f"{codes}); set src_lang and tgt_lang in the recipe to two of them"
        )


def _segment(languages: dict[str, str], lang: str) -> str | None:
    """The segment in `lang`: its exact code first (any case), else the first whose first subtag is `lang`'s."""
    lang = lang.lower()
    if lang in languages:
        return languages[lang]
    primary = lang.split("-")[0].split("_")[0]
    return next((text for code, text in languages.items() if code.split("-")[0].split("_")[0] == primary), None)


def _units(path: Path) -> Iterator[dict[str, str]]:
    """Each `<tu>`'s segments by lower-cased language code, read one unit at a time; a file that is not
    well-formed XML is one line naming its line and column."""
    with open_binary(path) as handle:
        # no DTD, no entities from outside, no network: a memory is data, not instructions
        units = etree.iterparse(handle, events=("end",), tag="{*}tu", resolve_entities=False, no_network=True, load_dtd=False)
        try:
            for _, unit in units:
                yield _languages(unit)
                unit.clear(keep_tail=False)
                while unit.getprevious() is not None:  # units already read: free them as the file goes on
                    del unit.getparent()[0]
        except etree.XMLSyntaxError as err:
            line, column = err.position
            message = err.msg.split(" (line")[0] if err.msg else "syntax error"
            raise MtkitError(
                f"{path}:{line}:{column}: not well-formed TMX ({message}); fix the file or export the memory again"
            ) from None
        except (gzip.BadGzipFile, EOFError) as err:
            raise MtkitError(f"{path}: damaged gzip file ({err}); decompress it or download it again") from None


def _languages(unit: etree._Element) -> dict[str, str]:
    """A unit's segment text by lower-cased language (TMX 1.4's xml:lang, or 1.1's lang)."""
    segments = {}
    for variant in unit.iterfind("{*}tuv"):
        code = variant.get(XML_LANG) or variant.get("lang")
        segment = variant.find("{*}seg")
        if code and segment is not None:
            segments.setdefault(code.lower(), " ".join(_text(segment).split()))
    return segments


def _text(element: etree._Element) -> str:
    """The segment's text without its native codes, comments and entities left unresolved (each one's tail is text)."""
    pieces = [element.text or ""]
    for child in element:
        if isinstance(child.tag, str) and etree.QName(child).localname not in NATIVE_CODES:
            pieces.append(_text(child))
        pieces.append(child.tail or "")
    return "".join(pieces)
