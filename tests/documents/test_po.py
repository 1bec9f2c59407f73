"""PO files: untranslated entries translated into their msgstr (plurals in every form) and marked fuzzy, the header,
comments, flags and contexts byte for byte as read, translated entries left alone unless asked, placeholders kept."""

from __future__ import annotations

import pytest
from documents.stub_translator import StubTranslator
from translate.storage import pypo

from mtkit.decoding.options import Decoding, FileOptions
from mtkit.documents import po
from mtkit.documents.files import DocumentOptions, translate_document_file
from mtkit.documents.formats import DocumentLimits
from mtkit.documents.pipeline import translate_blocks
from mtkit.errors import MtkitError

HEADER = """# German messages of the demo package.
# Copyright (C) 2026 The demo authors
#
msgid ""
msgstr ""
"Project-Id-Version: demo 1.0\\n"
"Language: en\\n"
"MIME-Version: 1.0\\n"
"Content-Type: text/plain; charset=UTF-8\\n"
"Content-Transfer-Encoding: 8bit\\n"
"Plural-Forms: nplurals=NPLURALS; plural=PLURAL;\\n"
"""
ENTRIES = """
#. A comment for translators, long enough that a writer that wraps lines would be tempted to wrap it somewhere.
#: src/main.c:10 src/main.c:20
#, c-format
msgid "Ein Hund läuft über %s nach Hause."
msgstr ""

#: src/main.c:30
#, c-format
msgid "%d Datei gelöscht"
msgid_plural "%d Dateien gelöscht"
msgstr[0] ""
msgstr[1] ""

msgctxt "menu"
msgid "Öffnen"
msgstr ""

# a translator's comment
#, python-format
msgid "Hallo %(name)s und willkommen"
msgstr "Hello %(name)s and welcome"

#, python-brace-format
msgid ""
"Verwendung: {prog} [Optionen]\\n"
"Siehe https://example.org/hilfe für mehr.\\n"
msgstr ""

#~ msgid "Alt"
#~ msgstr "Old"
"""


def messages(forms: int = 2) -> str:
    plural = "(n != 1)" if forms == 2 else "0" if forms == 1 else "(n==1 ? 0 : n>=2 && n<=4 ? 1 : 2)"
    return HEADER.replace("NPLURALS", str(forms)).replace("PLURAL", plural) + ENTRIES


def translated(text: str, *, retranslate: bool = False) -> tuple[str, StubTranslator]:
    document = po.read(text, name="messages.po", limits=DocumentLimits(), retranslate=retranslate)
    translator = StubTranslator()
    blocks = translate_blocks(translator, document.blocks, decoding=Decoding())
    return document.render(blocks), translator


def units(text: str) -> list[pypo.pounit]:
    return pypo.pofile.parsestring(text.encode()).units


def test_each_untranslated_entry_is_translated_marked_fuzzy_and_keeps_its_placeholders() -> None:
    output, translator = translated(messages())
    header, simple, plural, context, done, usage, obsolete = units(output)
    assert [simple.target, *plural.target.strings, context.target, usage.target] == [
        "EIN HUND LÄUFT ÜBER %s NACH HAUSE.",
        "%d DATEI GELÖSCHT",
        "%d DATEIEN GELÖSCHT",
        "ÖFFNEN",
        "VERWENDUNG: {prog} [OPTIONEN]\nSIEHE https://example.org/hilfe FÜR MEHR.\n",
    ]
    assert all(unit.isfuzzy() for unit in (simple, plural, context, usage))
    assert simple.hastypecomment("c-format") and context.getcontext() == "menu"
    assert done.target == "Hello %(name)s and welcome" and not done.isfuzzy()
    assert obsolete.isobsolete() and obsolete.target == "Old"
    # the model reads neither placeholders nor line breaks
    assert not any("%" in text or "{" in text or "\n" in text or "http" in text for text in translator.texts)


def test_the_header_and_every_comment_are_written_byte_for_byte() -> None:
    source = messages()
    output, _ = translated(source)
    assert output.startswith(HEADER.replace("NPLURALS", "2").replace("PLURAL", "(n != 1)"))
    comments = [line for line in source.splitlines() if line.startswith(("#.", "#:", "# ", "#~", "msgctxt"))]
    assert comments == [line for line in output.splitlines() if line.startswith(("#.", "#:", "# ", "#~", "msgctxt"))]


@pytest.mark.parametrize(("forms", "expected"), [
    (1, ["%d DATEIEN GELÖSCHT"]),
    (3, ["%d DATEI GELÖSCHT", "%d DATEIEN GELÖSCHT", "%d DATEIEN GELÖSCHT"]),
])  # fmt: skip
def test_a_plural_entry_fills_every_form_the_header_counts(forms: int, expected: list[str]) -> None:
    output, _ = translated(messages(forms))
    assert units(output)[2].target.strings == expected


def test_retranslate_translates_the_translated_entries_too() -> None:
    output, _ = translated(messages(), retranslate=True)
    done = units(output)[4]
    assert done.target == "HALLO %(name)s UND WILLKOMMEN" and done.isfuzzy()


def test_a_file_translated_already_is_written_as_read() -> None:
    first, _ = translated(messages())
    again, translator = translated(first)
    assert again == first and translator.texts == []


@pytest.mark.parametrize(("text", "said"), [
    ('msgid "a"\nmsgstr "b\n', "messages.po: not a PO file ("),
    (HEADER.replace("NPLURALS", "40").replace("PLURAL", "n"), "messages.po: the header's Plural-Forms says nplurals=40"),
])  # fmt: skip
def test_a_broken_file_is_one_line(text: str, said: str) -> None:
    with pytest.raises(MtkitError) as caught:
        po.read(text, name="messages.po", limits=DocumentLimits())
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


def test_translate_document_file_writes_the_po_file_and_refuses_retranslate_for_text(tmp_path) -> None:
    source = tmp_path / "messages.po"
    source.write_text(messages(), encoding="utf-8")
    file = FileOptions(input=source, output=tmp_path / "messages.en.po")
    translator = StubTranslator()
    assert translate_document_file(translator, DocumentOptions(file=file, format="po")) == len(translator.texts) == 6
    assert units(file.output.read_text(encoding="utf-8"))[1].target == "EIN HUND LÄUFT ÜBER %s NACH HAUSE."
    with pytest.raises(
        MtkitError, match="--retranslate: a text file holds no translations to redo; it works with --format po, xliff"
    ):
        translate_document_file(translator, DocumentOptions(file=file, format="text", retranslate=True))
