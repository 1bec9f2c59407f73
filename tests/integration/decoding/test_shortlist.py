"""`mtkit shortlist RUN` on the trained reverse task (eflomal's alignments of its prepared pairs), and translation
with it: the same outputs as the full vocabulary in every search, on both engines; scores never use it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers import REVERSE_PROBES, assert_one_line_error, cli_output, invoke, succeeded

from mtkit.decoding.ct2_engine import load_export
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.run_files import RunFiles

PREFIXES = ["", "c", "", "h g", "", "", "", "", "i j"]
CONSTRAINTS = [["b"], [], ["g", "e"], [], ["j"], [], ["k"], [], []]


@pytest.fixture(scope="module")
def shortlisted(reverse_run, tmp_path_factory) -> tuple[Path, str]:
    """A copy of the reverse run (the shared run is left without a shortlist) with a shortlist of one target piece per
    source piece and no frequent ones; what the command printed."""
    run = tmp_path_factory.mktemp("shortlisted") / "run"
    run.mkdir()
    for name in ("config.yaml", "best.pt"):
        shutil.copy(reverse_run.run_path / name, run / name)
    said = succeeded(invoke("shortlist", run, "--k", 1, "--frequent", 0))
    return run, said.stderr


def test_the_command_aligns_the_runs_training_pairs_and_reports_size_and_coverage(shortlisted):
    run, said = shortlisted
    assert RunFiles(run).shortlist.is_file()
    assert "k=1" in said and "validation target pieces covered: 100.00%" in said  # a letter is aligned to itself


@pytest.mark.parametrize(("beam", "nbest"), [(1, 1), (4, 1), (4, 3)])
def test_translations_with_the_shortlist_equal_those_without(shortlisted, beam, nbest):
    translator = Translator.load(shortlisted[0], device="cpu")
    lines, decoding = [*REVERSE_PROBES, ""], Decoding(beam=beam, nbest=nbest)
    found = translator.translate_nbest(lines, decoding)
    full = translator.translate_nbest(lines, Decoding(beam=beam, nbest=nbest, shortlist=False))
    # the best of each: the n-best's runners-up may hold letters a one-piece shortlist leaves out
    assert [best[0].tokens for best in found] == [best[0].tokens for best in full]
    assert [len(best) for best in found] == [nbest] * len(lines)
    assert [best[0].text for best in found[:2]] == ["c b a", "d c b a"]


def test_prefixes_constraints_and_alignments_with_the_shortlist_equal_those_without(shortlisted):
    translator = Translator.load(shortlisted[0], device="cpu")
    outputs = []
    for shortlist in (True, False):
        decoding = Decoding(beam=4, alignments=True, shortlist=shortlist)
        best = translator.translate_nbest(REVERSE_PROBES, decoding, prefixes=PREFIXES, constraints=CONSTRAINTS)
        outputs.append([(t[0].text, t[0].alignment, t[0].unmet) for t in best])
    assert outputs[0] == outputs[1]
    assert outputs[0][3][0].startswith("h g") and "j" in outputs[0][4][0].split()


def test_the_ctranslate2_export_carries_the_shortlist_as_a_vocabulary_map(shortlisted, tmp_path):
    run, _ = shortlisted
    cli_output("export", "-m", run, "--format", "ctranslate2", "-o", tmp_path / "ct2")
    assert (tmp_path / "ct2/vmap.txt").read_text(encoding="utf-8").startswith("\t<pad>")
    exported = Translator.over(load_export(tmp_path / "ct2", threads=1))
    pytorch = Translator.load(run, device="cpu")
    for decoding in (Decoding(beam=1), Decoding(beam=4, nbest=2)):
        with_map = exported.translate_nbest(REVERSE_PROBES, decoding, prefixes=PREFIXES)
        without = exported.translate_nbest(
            REVERSE_PROBES, Decoding(**{**decoding.__dict__, "shortlist": False}), prefixes=PREFIXES
        )
        expected = pytorch.translate_nbest(REVERSE_PROBES, decoding, prefixes=PREFIXES)
        # the best of each (the runners-up depend on how each engine fills its candidate set up to its size)
        assert [best[0].tokens for best in with_map] == [best[0].tokens for best in expected]
        assert [best[0].tokens for best in with_map] == [best[0].tokens for best in without]


def test_scores_never_use_the_shortlist(shortlisted, reverse_run):
    sources, targets = REVERSE_PROBES, ["a b c"] * len(REVERSE_PROBES)  # mostly wrong: the pieces lie outside it
    found = Translator.load(shortlisted[0], device="cpu").score(sources, targets)
    expected = Translator.load(reverse_run.run_path, device="cpu").score(sources, targets)
    assert [s.log_prob for s in found] == [s.log_prob for s in expected]


def test_a_damaged_shortlist_and_a_missing_one_asked_for_are_one_line(shortlisted, reverse_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(shortlisted[0], run)
    RunFiles(run).shortlist.write_bytes(b"damaged")
    assert_one_line_error(invoke("translate", "-m", run, input="a b c\n"), "shortlist.safetensors", "mtkit shortlist RUN")
    bare = invoke("translate", "-m", reverse_run.run_path, "--shortlist", input="a b c\n")
    assert_one_line_error(bare, "--shortlist: this model has no vocabulary shortlist", "mtkit shortlist RUN")
    assert succeeded(invoke("translate", "-m", shortlisted[0], "--no-shortlist", input="a b c\n")).stdout == "c b a\n"


def test_a_given_parallel_corpus_is_aligned_instead_of_the_prepared_pairs(reverse_run, tmp_path):
    run = tmp_path / "imported"
    run.mkdir()
    payload = torch.load(reverse_run.run_path / "best.pt", weights_only=True)
    payload["config"]["data_dir"] = str(tmp_path / "elsewhere")  # its prepared data is not here
    torch.save(payload, run / "best.pt")
    assert_one_line_error(invoke("shortlist", run), "prepared training data", "give a parallel corpus with --src FILE --tgt FILE")
    raw = reverse_run.data_path.parent / "raw"
    assert_one_line_error(invoke("shortlist", run, "--src", raw / "valid.src"), "--src and --tgt go together")
    said = succeeded(invoke("shortlist", run, "--src", raw / "valid.src", "--tgt", raw / "valid.tgt", "--k", 2)).stderr
    assert "50 pairs aligned, k=2" in said


def test_evaluate_scores_the_same_with_the_shortlist_and_without(shortlisted, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(shortlisted[0], run)
    reports = [
        cli_output("evaluate", "-m", run, "--split", "valid", "--json", "--no-save-scores", flag)
        for flag in ("--shortlist", "--no-shortlist")
    ]
    assert reports[0] == reports[1] and '"BLEU"' in reports[0]
