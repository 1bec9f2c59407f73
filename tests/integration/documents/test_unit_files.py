"""`mtkit translate --format po` and `--format xliff` with a trained model (the reverse task, where each target
letter aligns to its source letter): every placeholder and inline code comes back after the reversed letter it
followed, and the files read back with translate-toolkit. The PO file's texts, placeholders masked, are lines the
fixture's margin covers (`REVERSE_PROBES`)."""

from __future__ import annotations

from pathlib import Path

from helpers import invoke, succeeded
from translate.storage import pypo, xliff2

PO = """msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"
"Plural-Forms: nplurals=2; plural=(n != 1);\\n"

#, c-format
msgid "a b %s c d"
msgstr ""

#, python-brace-format
msgid "{count} e f g"
msgid_plural "d e f g {count} h"
msgstr[0] ""
msgstr[1] ""

msgid "h i j"
msgstr "done by a person"
"""
XLIFF = """<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="xx" trgLang="yy">
  <file id="f">
    <unit id="u">
      <segment>
        <source>a <pc id="1">b c</pc> d <ph id="2"/>e https://example.org</source>
      </segment>
    </unit>
  </file>
</xliff>
"""


def test_a_po_file_is_translated_with_its_placeholders_after_the_letters_they_followed(reverse_run, tmp_path: Path) -> None:
    source, output = tmp_path / "messages.po", tmp_path / "out.po"
    source.write_text(PO, encoding="utf-8")
    succeeded(invoke("translate", "-m", reverse_run.run_path, "-i", source, "-o", output, "--format", "po", "--beam", "2"))
    simple, plural, done = [unit for unit in pypo.pofile.parsestring(output.read_bytes()).units if not unit.isheader()]
    assert simple.target == "d c b %s a" and simple.isfuzzy()
    assert plural.target.strings == ["{count} g f e", "h g {count} f e d"] and plural.isfuzzy()
    assert done.target == "done by a person" and not done.isfuzzy()
    redone = tmp_path / "redone.po"
    succeeded(invoke("translate", "-m", reverse_run.run_path, "-i", output, "-o", redone, "--format", "po", "--retranslate"))
    assert pypo.pofile.parsestring(redone.read_bytes()).units[-1].target == "j i h"


def test_an_xliff_file_is_translated_with_its_inline_codes_around_the_reversed_letters(reverse_run, tmp_path: Path) -> None:
    source, output = tmp_path / "app.xlf", tmp_path / "out.xlf"
    source.write_text(XLIFF, encoding="utf-8")
    succeeded(invoke("translate", "-m", reverse_run.run_path, "-i", source, "-o", output, "--format", "xliff", "--beam", "2"))
    unit = xliff2.Xliff2File.parsestring(output.read_bytes()).units[0]
    target = unit.get_target_dom()
    assert "".join(target.itertext()).split() == ["e", "https://example.org", "d", "c", "b", "a"]
    assert [child.get("id") for child in target] == ["2", "1"]
    assert "".join(target[1].itertext()).split() == ["c", "b"]
    assert unit.xmlelement.get("state") == "initial"
