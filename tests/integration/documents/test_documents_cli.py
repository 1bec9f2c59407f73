"""HTML and XML through `mtkit translate --format` and `mtkit evaluate --format` on the reverse-task model, whose
alignments are anti-diagonal (but for a stray link now and then): each tag comes back around the words it marked."""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers import REVERSE_PROBES, assert_one_line_error, cli_output, invoke, reverse, write_text_lines

from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.documents.formats import DocumentLimits
from mtkit.documents.pipeline import translate_documents
from mtkit.documents.sentences import source_splitter


def anti_diagonal(translator: Translator, lines: list[str]) -> list[bool]:
    """Whether the model links each line's words exactly to their mirror images (the links that place tags)."""
    found = translator.translate_nbest(lines, Decoding(alignments=True))
    mirrored = [[(len(line.split()) - 1 - j, j) for j in range(len(line.split()))] for line in lines]
    return [best.source_alignment == pairs for pairs, [best] in zip(mirrored, found, strict=True)]


def test_a_tag_goes_around_the_word_it_marked_wherever_the_alignment_is_exact(reverse_run):
    translator = Translator.load(reverse_run.run_path, device="cpu")
    lines = (reverse_run.data_path.parent / "raw/valid.src").read_text(encoding="utf-8").splitlines()[:30]
    tagged = [f"<p>{line.split()[0]} <b>{line.split()[1]}</b> {' '.join(line.split()[2:])}</p>" for line in lines]
    found = translate_documents(translator, tagged, document_format="html", decoding=Decoding(), limits=DocumentLimits())
    exact = anti_diagonal(translator, lines)
    for line, document, aligned in zip(lines, found, exact, strict=True):
        assert document.text == reverse(line) and document.markup.count("<b>") == document.markup.count("</b>") == 1
        words = reverse(line).split()
        words[-2] = f"<b>{words[-2]}</b>"
        assert document.markup == f"<p>{' '.join(words)}</p>" or not aligned
    assert sum(exact) >= 0.8 * len(lines)


def test_a_page_comes_back_with_every_tag_and_its_code_untouched(reverse_run, tmp_path):
    page = tmp_path / "page.html"
    page.write_text(
        "<!DOCTYPE html><html><head><title>a b c</title></head><body>\n"
        '<p><b>a</b> b c</p>\n<p>d <i>e <a href="x?y=1&amp;z=2">f</a></i> g</p>\n'
        "<p>h i <code>x &lt; y</code> j<br>l k j i</p>\n<script>if (a < b) {}</script>\n</body></html>\n",
        encoding="utf-8",
    )
    out = cli_output("translate", "-m", reverse_run.run_path, "-i", page, "--format", "html")
    assert "<title>c b a</title>" in out and "<code>x &lt; y</code>" in out and "<script>if (a < b) {}</script>" in out
    for tag in ("<b>", "</b>", "<i>", "</i>", '<a href="x?y=1&amp;z=2">', "</a>", "<br>", "<p>", "</p>"):
        assert out.count(tag) == page.read_text(encoding="utf-8").count(tag)
    assert "<br>i j k l</p>" in out


def test_xml_blocks_come_back_with_their_elements(reverse_run, tmp_path):
    document = tmp_path / "doc.xml"
    document.write_text(
        '<?xml version="1.0"?>\n<doc><p>d <em>e</em> f g</p><p translate="no">a b c</p></doc>\n', encoding="utf-8"
    )
    out = tmp_path / "out.xml"
    invoke("translate", "-m", reverse_run.run_path, "-i", document, "-o", out, "--format", "xml")
    written = out.read_text(encoding="utf-8")
    assert written.startswith('<?xml version="1.0"?>\n<doc><p>') and written.endswith('</p><p translate="no">a b c</p></doc>')
    assert written.count("<em>") == written.count("</em>") == 1
    if anti_diagonal(Translator.load(reverse_run.run_path, device="cpu"), ["d e f g"]) == [True]:
        assert "<p>g f <em>e</em> d</p>" in written


def test_evaluate_scores_the_output_without_its_tags(reverse_run, tmp_path):
    sources = write_text_lines(tmp_path / "src.html", [f"<p><b>{probe}</b></p>" for probe in REVERSE_PROBES])
    references = write_text_lines(tmp_path / "ref.txt", [reverse(probe) for probe in REVERSE_PROBES])
    output = tmp_path / "out.html"
    said = cli_output(
        "evaluate", "-m", reverse_run.run_path, "--src", sources, "--ref", references, "--format", "html", "-o", output
    )
    assert said.startswith("BLEU") and "100.00" in said.splitlines()[0]
    assert output.read_text(encoding="utf-8").splitlines() == [f"<p><b>{reverse(probe)}</b></p>" for probe in REVERSE_PROBES]


def test_bad_documents_are_refused_in_one_line_before_any_work(reverse_run, tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<doc>\n  <p>a</doc>\n", encoding="utf-8")
    assert_one_line_error(invoke("translate", "-m", reverse_run.run_path, "-i", bad, "--format", "xml"), f"{bad}:2:")
    binary = tmp_path / "image.html"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert_one_line_error(invoke("translate", "-m", reverse_run.run_path, "-i", binary, "--format", "html"), "a binary file")


def test_with_the_runs_word_priors_every_tag_goes_around_the_word_it_marked_in_both_engines(reverse_run, tmp_path):
    pytest.importorskip("eflomal")
    pytest.importorskip("ctranslate2")
    run = tmp_path / "run"  # a copy: the shared run stays without priors
    shutil.copytree(reverse_run.run_path, run, ignore=shutil.ignore_patterns("*.lock", "step_*"))
    invoke("priors", run)
    assert (run / "word_priors.txt").read_text(encoding="utf-8").startswith("# mtkit word priors {")
    invoke("export", "-m", run, "--format", "ctranslate2", "-o", tmp_path / "ct2")
    for name in ("word_priors.txt", "sentence_ends.tsv"):  # the export places tags and cuts paragraphs as the run does
        assert (tmp_path / "ct2" / name).read_bytes() == (run / name).read_bytes()
    assert (run / "sentence_ends.tsv").read_text(encoding="utf-8").startswith("# mtkit sentence ends {")
    lines = (reverse_run.data_path.parent / "raw/valid.src").read_text(encoding="utf-8").splitlines()[:30]
    tagged = [f"<p>{line.split()[0]} <b>{line.split()[1]}</b> {' '.join(line.split()[2:])}</p>" for line in lines]
    threads = torch.get_num_threads()  # CTranslate2's loading sets torch's to the machine's
    for model in (run, tmp_path / "ct2"):  # both engines
        translator = Translator.load(model, device="cpu")
        torch.set_num_threads(threads)
        assert source_splitter(translator, language=None).ends is not None
        found = translate_documents(translator, tagged, document_format="html", decoding=Decoding(), limits=DocumentLimits())
        for line, document in zip(lines, found, strict=True):
            words = reverse(line).split()
            words[-2] = f"<b>{words[-2]}</b>"
            assert document.markup == f"<p>{' '.join(words)}</p>" or document.text != reverse(line)
        assert sum(document.text == reverse(line) for line, document in zip(lines, found, strict=True)) >= 27
