"""GNU gettext's own checker accepts the PO files `--format po` writes: plural forms, c-format and python-format
strings, contexts and the header (`msgfmt --check`, on the machine translations too: `--use-fuzzy`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from documents.stub_translator import StubTranslator
from documents.test_po import messages

from mtkit.decoding.options import Decoding
from mtkit.documents import po
from mtkit.documents.formats import DocumentLimits
from mtkit.documents.pipeline import translate_blocks


@pytest.mark.skipif(shutil.which("msgfmt") is None, reason="msgfmt (GNU gettext) is not installed on this machine")
@pytest.mark.parametrize("forms", [1, 2, 3])
def test_msgfmt_checks_the_translated_file(tmp_path: Path, forms: int) -> None:
    source = messages(forms)
    document = po.read(source, name="messages.po", limits=DocumentLimits())
    translated = document.render(translate_blocks(StubTranslator(), document.blocks, decoding=Decoding()))
    for name, text in (("source.po", source), ("translated.po", translated)):
        (tmp_path / name).write_text(text, encoding="utf-8")
        for fuzzy in ([], ["--use-fuzzy"]):
            checked = subprocess.run(["msgfmt", "--check", *fuzzy, "-o", "/dev/null", name], cwd=tmp_path,
                                     capture_output=True, text=True, check=False)  # fmt: skip
            assert checked.returncode == 0, checked.stderr
