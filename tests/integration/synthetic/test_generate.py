"""Synthetic corpora: a model writes one side of a training corpus at `mtkit prepare`, once, cached and resumable."""

from __future__ import annotations

import pytest
from helpers import cli_said, synthetic_recipe
from marian_builder import build_marian

from mtkit.config import load_config
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import load_tokenizers
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.importers.marian import import_marian
from mtkit.synthetic.generate import synthesize
from mtkit.synthetic.jobs import plan_jobs

pytestmark = pytest.mark.slow


def test_the_models_sides_are_their_translations_in_input_order_and_the_tag_goes_first(synthetic_prepared, reverse_run):
    root, recipe, said = synthetic_prepared
    assert "data.train[1]: its tgt is written by a model; the tokenizer learns from its src" in said
    jobs = plan_jobs(load_config(recipe))
    assert [job.done for job in jobs] == [True, True] and [job.side for job in jobs] == ["tgt", "src"]
    sources = (root / "raw" / "train.src").read_text(encoding="utf-8").splitlines()
    teacher = Translator.load([reverse_run.run_path])
    expected = [found[0].text for found in teacher.translate_nbest(sources, Decoding(beam=2))]
    assert jobs[0].output.read_text(encoding="utf-8").splitlines() == expected
    split = load_prepared(root / "data", "train")
    corpus, src_ids = split["corpus"], split["src_ids"]
    bt = load_tokenizers(root / "data", joint=True).src.control_id("<bt>")
    assert bt is not None and {ids[0] == bt for ids, c in zip(src_ids, corpus, strict=True) if c == 2} == {True}
    assert bt not in {ids[0] for ids, c in zip(src_ids, corpus, strict=True) if c != 2}
    cli_said("train", recipe)  # the tagged corpus trains like any other
    assert (root / "run" / "last.pt").is_file()


def test_a_second_prepare_reuses_the_cache_unless_the_model_input_or_decoding_changes(synthetic_prepared, reverse_run, tmp_path):
    root, recipe, _ = synthetic_prepared
    first = plan_jobs(load_config(recipe))
    stamps = [job.output.stat().st_mtime_ns for job in first]
    unrelated = synthetic_recipe(root, reverse_run.run_path, **{"train": {"max_steps": 99}})
    assert [job.folder for job in plan_jobs(load_config(unrelated))] == [job.folder for job in first]
    assert "is cached" in cli_said("prepare", unrelated)
    assert [job.output.stat().st_mtime_ns for job in first] == stamps
    other_beam = plan_jobs(load_config(synthetic_recipe(root, reverse_run.run_path, **{"distilled.decode": {"beam": 3}})))
    assert other_beam[0].folder != first[0].folder and other_beam[1].folder == first[1].folder
    copy = tmp_path / "teacher_copy"
    copy.mkdir()
    (copy / "best.pt").write_bytes((reverse_run.run_path / "best.pt").read_bytes() + b"")  # the same weights: the same key
    assert plan_jobs(load_config(synthetic_recipe(root, copy)))[0].folder == first[0].folder
    synthetic_recipe(root, reverse_run.run_path)  # leave the module's recipe as it was


def test_bad_synthetic_corpora_are_one_error_before_any_work(reverse_run, tmp_path):
    recipe = synthetic_recipe(tmp_path, reverse_run.run_path)
    missing = load_config(synthetic_recipe(tmp_path, tmp_path / "nowhere"))
    with pytest.raises(MtkitError, match=r"data.train\[1\].translate_with: .*nowhere does not exist"):
        synthesize(missing)
    (tmp_path / "empty.src").write_text("")
    empty = load_config(
        recipe, ["data.train=[{src: " + str(tmp_path / "empty.src") + ", translate_with: " + str(reverse_run.run_path) + "}]"]
    )
    with pytest.raises(MtkitError, match="empty.src: the file is empty"):
        synthesize(empty)
    build_marian(tmp_path / "marian")  # a model of en -> fr
    import_marian(str(tmp_path / "marian"), tmp_path / "en_fr")
    wrong = load_config(synthetic_recipe(tmp_path, tmp_path / "en_fr"), ["src_lang=de", "tgt_lang=en"])
    with pytest.raises(MtkitError, match=r"translate_with: .*en_fr translates en -> fr, but this corpus needs de -> en"):
        synthesize(wrong)
    assert not list((tmp_path / "data").glob("synthetic/*/chunks/*.txt"))  # nothing was translated
