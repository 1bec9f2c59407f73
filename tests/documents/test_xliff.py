"""XLIFF 1.2 and 2.0: untranslated units get a target marked as a machine translation to review, inline codes
each exactly once, the rest of the file as read; translate-toolkit and lxml read the output back."""

from __future__ import annotations

import difflib

import pytest
from documents.stub_translator import StubTranslator
from lxml import etree
from translate.storage import xliff as toolkit_xliff
from translate.storage import xliff2 as toolkit_xliff2

from mtkit.decoding.options import Decoding
from mtkit.documents import xliff
from mtkit.documents.formats import DocumentLimits, DocumentTooLarge
from mtkit.documents.pipeline import translate_blocks
from mtkit.errors import MtkitError

XLIFF_1 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:1.2" version="1.2">
  <file original="app.properties" source-language="de" target-language="en" datatype="plaintext">
    <header>
      <note>A header note.</note>
    </header>
    <body>
      <trans-unit id="1">
        <source>Ein <g id="1" ctype="bold">kleiner Hund</g> läuft über %s nach Hause</source>
        <note>A note for translators.</note>
      </trans-unit>
      <trans-unit id="2">
        <source>Zwei Männer <x id="2" ctype="lb"/>lachen</source>
        <target state="final">Two men <x id="2" ctype="lb"/>laugh</target>
      </trans-unit>
      <trans-unit id="3" translate="no">
        <source>mtkit</source>
      </trans-unit>
      <trans-unit id="4">
        <source>Klicken <bpt id="3">&lt;a&gt;</bpt>hier<ept id="3">&lt;/a&gt;</ept> und <ph id="4">&lt;br/&gt;</ph> dort</source>
        <target></target>
      </trans-unit>
    </body>
  </file>
</xliff>
"""
XLIFF_2 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="de" trgLang="en">
  <file id="f1">
    <notes><note>A file note.</note></notes>
    <unit id="u1">
      <segment>
        <source>Ein <pc id="1">kleiner Hund</pc> läuft über {name} nach Hause</source>
      </segment>
    </unit>
    <unit id="u2">
      <segment state="final">
        <source>Zwei Männer <ph id="2"/>lachen</source>
        <target>Two men <ph id="2"/>laugh</target>
      </segment>
    </unit>
    <unit id="u3" translate="no">
      <segment>
        <source>mtkit</source>
      </segment>
    </unit>
    <unit id="u4">
      <segment>
        <source>Klicken Sie <sc id="3"/>hier<ec startRef="3"/> und dort</source>
      </segment>
      <segment>
        <source>Mehr unter https://example.org/a?b=1&amp;c=2 heute</source>
      </segment>
    </unit>
  </file>
</xliff>
"""
STORES = {XLIFF_1: toolkit_xliff.xlifffile, XLIFF_2: toolkit_xliff2.Xliff2File}


def translated(text: str, *, retranslate: bool = False) -> tuple[str, StubTranslator]:
    document = xliff.read(text, name="app.xlf", limits=DocumentLimits(), retranslate=retranslate)
    translator = StubTranslator()
    return document.render(translate_blocks(translator, document.blocks, decoding=Decoding())), translator


def targets(text: str) -> list[str | None]:
    """Each unit's target as written, inline codes included, as translate-toolkit finds it."""
    store = STORES[XLIFF_1 if "1.2" in text.splitlines()[1] else XLIFF_2].parsestring(text.encode())
    return [None if unit.get_target_dom() is None else inner(unit.get_target_dom()) for unit in store.units]


def inner(element: etree._Element) -> str:
    """An element's content as XML, without the namespace declarations lxml writes on each child."""
    content = (element.text or "") + "".join(etree.tostring(child, encoding="unicode") for child in element)
    return content.replace(' xmlns="urn:oasis:names:tc:xliff:document:1.2"', "").replace(
        ' xmlns="urn:oasis:names:tc:xliff:document:2.0"', ""
    )


def squeezed(texts: list[str | None]) -> list[str | None]:
    """Each text without whitespace: where each inline code went, not the spacing `tags.place_spans` gives it."""
    return [text if text is None else "".join(text.split()) for text in texts]


def test_xliff_1_2_targets_are_filled_for_review_with_each_inline_code_once() -> None:
    output, translator = translated(XLIFF_1)
    assert squeezed(targets(output)) == squeezed(
        [
            'EIN <g id="1" ctype="bold">KLEINER HUND</g> LÄUFT ÜBER %s NACH HAUSE',
            'Two men <x id="2" ctype="lb"/>laugh',
            None,
            'KLICKEN <bpt id="3">&lt;a&gt;</bpt>HIER<ept id="3">&lt;/a&gt;</ept> UND <ph id="4">&lt;br/&gt;</ph> DORT',
        ]
    )
    root = etree.fromstring(output.encode())
    states = [(target.get("state"), target.get("state-qualifier")) for target in root.iter(f"{{{xliff.XLIFF_1}}}target")]
    assert states == [
        ("needs-review-translation", "mt-suggestion"),
        ("final", None),
        ("needs-review-translation", "mt-suggestion"),
    ]
    assert "mtkit" not in translator.texts and all("%" not in text for text in translator.texts)


def test_xliff_2_0_segments_are_initial_with_a_machine_substate() -> None:
    output, _ = translated(XLIFF_2)
    assert squeezed(targets(output)) == squeezed(
        [
            'EIN <pc id="1">KLEINER HUND</pc> LÄUFT ÜBER {name} NACH HAUSE',
            'Two men <ph id="2"/>laugh',
            None,
            'KLICKEN SIE <sc id="3"/>HIER<ec startRef="3"/> UND DORT',
            "MEHR UNTER https://example.org/a?b=1&c=2 HEUTE",
        ]
    )
    assert output.count("https://example.org/a?b=1&amp;c=2") == 2  # the source's and the target's, escaped
    segments = etree.fromstring(output.encode()).iter(f"{{{xliff.XLIFF_2}}}segment")
    states = [(segment.get("state"), segment.get("subState")) for segment in segments]
    machine = ("initial", "mtkit:machine-translation")
    assert states == [machine, ("final", None), (None, None), machine, machine]


@pytest.mark.parametrize("source", [XLIFF_1, XLIFF_2], ids=["1.2", "2.0"])
def test_the_lines_without_a_new_target_are_written_as_read(source: str) -> None:
    output, _ = translated(source)
    before, after = source.splitlines(), output.splitlines()
    for tag, low, high, new_low, new_high in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes():
        if tag != "equal":  # a target written (or an empty one filled), a 2.0 segment's state set: nothing else
            assert all("<segment>" in line or "<target></target>" in line for line in before[low:high])
            assert all("<target" in line or 'subState="mtkit:' in line for line in after[new_low:new_high])


@pytest.mark.parametrize("source", [XLIFF_1, XLIFF_2], ids=["1.2", "2.0"])
def test_translated_units_are_kept_unless_retranslate(source: str) -> None:
    first, _ = translated(source)
    again, translator = translated(first)
    assert again == first and translator.texts == []
    redone, _ = translated(source, retranslate=True)
    assert targets(redone)[1].startswith("ZWEI MÄNNER <")


@pytest.mark.parametrize(("text", "said"), [
    (XLIFF_1.replace("</source>\n        <note>", "</sourc>\n        <note>"), "app.xlf:9:"),
    ('<?xml version="1.0"?><html><body/></html>', "app.xlf: the root element is html"),
])  # fmt: skip
def test_a_file_that_is_not_xliff_is_one_line(text: str, said: str) -> None:
    with pytest.raises(MtkitError) as caught:
        xliff.read(text, name="app.xlf", limits=DocumentLimits())
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


def test_inline_codes_past_the_limit_are_refused() -> None:
    with pytest.raises(DocumentTooLarge, match="more than 2 tags"):
        xliff.read(XLIFF_1, name="app.xlf", limits=DocumentLimits(max_tags=2))
