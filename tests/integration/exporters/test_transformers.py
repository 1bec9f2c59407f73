"""`mtkit export --format transformers`: folders that transformers loads and translates with, exactly.

A fine-tuned child of an imported OPUS-MT model becomes a plain MarianMTModel (and imports back);
mtkit's own pre-norm recipes become a folder with mtkit's modeling code (trust_remote_code=True).
"""

from __future__ import annotations

import gzip
import itertools
import json
import shutil

import pytest
import torch
from helpers import reverse
from marian_builder import SHARED, Variant, build_marian
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.decoding.engine import output_cap
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.exporters.transformers import export_transformers
from mtkit.importers.marian import import_marian
from mtkit.models.checkpoint import load_model

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("hf_modules_cache")]  # shared_fixtures.py
LINES = ["a man is walking .", "two dogs play in the snow .", "hello", "a b c d e f"]
REVERSE_LINES = ["a b c", "d e f g h", "l k j i", "h i j"]


def load(folder, remote=False):
    """The exported folder as transformers loads it: (tokenizer, model)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=remote)
    return tokenizer, transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=remote).eval()


def hf_log_probs(folder, sources, targets, remote=False):
    """transformers' teacher-forced log-probabilities of each target (its EOS included), from the exported folder."""
    tokenizer, model = load(folder, remote)
    batch = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
    labels = batch.pop("labels")
    start = torch.full((labels.size(0), 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        logits = model(**batch, decoder_input_ids=torch.cat([start, labels[:, :-1]], dim=1)).logits
    picked = torch.log_softmax(logits.float(), dim=-1).gather(2, labels.unsqueeze(2)).squeeze(2)
    return [float(row[label != tokenizer.pad_token_id].sum()) for row, label in zip(picked, labels, strict=True)]


def hf_greedy(folder, translator, sources, remote=False):
    """transformers' greedy ids of each source, one at a time, capped like mtkit's search (EOS and BOS dropped)."""
    tokenizer, model = load(folder, remote)
    found = []
    for line in sources:
        batch = tokenizer([line], return_tensors="pt")
        cap = output_cap(batch["input_ids"].size(1), translator.decode, max_positions=translator.engine.max_positions)
        ids = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=cap)[0].tolist()
        found.append([i for i in ids[1:] if i != model.config.eos_token_id])
    return found


def test_a_fine_tuned_opus_mt_child_is_a_plain_marian_model_with_mtkits_log_probs(marian_child, tmp_path):
    folder = export_transformers(marian_child, tmp_path / "hf")
    settings = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert settings["model_type"] == "marian" and "auto_map" not in settings and not list(folder.glob("*.py"))
    translator = Translator.load([marian_child])
    targets = [t[0].text for t in translator.translate_nbest(LINES, Decoding(beam=1))]
    theirs = hf_log_probs(folder, LINES, targets)
    mine = [score.log_prob for score in translator.score(LINES, targets)]
    assert max(abs(a - b) for a, b in zip(theirs, mine, strict=True)) < 1e-4
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder)
    assert type(model).__name__ == "MarianMTModel"


def test_greedy_generate_gives_mtkits_greedy_tokens(marian_child, tmp_path):
    folder = export_transformers(marian_child, tmp_path / "hf")
    translator = Translator.load([marian_child])
    mine = [t[0].tokens for t in translator.translate_nbest(LINES, Decoding(beam=1))]
    assert hf_greedy(folder, translator, LINES) == mine


def test_a_marian_export_imports_back_to_the_same_outputs(marian_child, tmp_path):
    folder = export_transformers(marian_child, tmp_path / "hf")
    import_marian(str(folder), tmp_path / "back")
    before, after = Translator.load([marian_child]), Translator.load([tmp_path / "back"])
    for decoding in (Decoding(beam=1), Decoding(beam=3, nbest=3)):
        ours = [[(t.text, round(t.score, 4)) for t in line] for line in before.translate_nbest(LINES, decoding)]
        back = [[(t.text, round(t.score, 4)) for t in line] for line in after.translate_nbest(LINES, decoding)]
        assert back == ours


def test_the_model_card_names_the_form_the_recipe_and_how_to_load(marian_child, tmp_path):
    folder = export_transformers(marian_child, tmp_path / "hf")
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\n") and "pipeline_tag: translation" in card
    assert "AutoModelForSeq2SeqLM.from_pretrained" in card and "trust_remote_code" not in card
    assert "train: " in card and "init_from" in card
    generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["decoder_start_token_id"] == 2 and generation["num_beams"] == load_model(marian_child)[1].decode.beam


def test_what_cannot_be_exported_is_one_error(reverse_rnn_run, marian_child, tmp_path):
    with pytest.raises(MtkitError, match="model.arch is 'rnn'; transformers has no class for mtkit's RNN models"):
        export_transformers(reverse_rnn_run.run_path, tmp_path / "rnn")
    assert not (tmp_path / "rnn").exists()
    runner = CliRunner()
    twice = runner.invoke(
        app, ["export", "-m", str(marian_child), "-m", str(marian_child), "--format", "transformers", "-o", str(tmp_path / "e")]
    )
    assert twice.exit_code == 2 and "an ensemble cannot be one" in twice.output
    quantised = runner.invoke(
        app, ["export", "-m", str(marian_child), "--format", "transformers", "--quantization", "int8", "-o", str(tmp_path / "q")]
    )
    assert quantised.exit_code == 2 and "--quantization int8: CTranslate2's weight types" in quantised.output
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(MtkitError, match="not empty; pass --force"):
        export_transformers(marian_child, tmp_path / "taken", force=False)
    shutil.rmtree(tmp_path / "taken")


def test_a_pre_norm_recipe_ships_its_modeling_code_and_translates_like_mtkit(reverse_run, tmp_path):
    folder = export_transformers(reverse_run.run_path, tmp_path / "hf")
    settings = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert settings["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_mtkit.MtkitForConditionalGeneration"
    assert (folder / "modeling_mtkit.py").is_file() and (folder / "configuration_mtkit.py").is_file()
    translator = Translator.load([reverse_run.run_path])
    targets = [reverse(line) for line in REVERSE_LINES]
    theirs = hf_log_probs(folder, REVERSE_LINES, targets, remote=True)
    mine = [score.log_prob for score in translator.score(REVERSE_LINES, targets)]
    assert max(abs(a - b) for a, b in zip(theirs, mine, strict=True)) < 1e-4
    greedy = [found[0].tokens for found in translator.translate_nbest(REVERSE_LINES, Decoding(beam=1))]
    assert hf_greedy(folder, translator, REVERSE_LINES, remote=True) == greedy
    tokenizer, model = load(folder, remote=True)
    batch = tokenizer(REVERSE_LINES, return_tensors="pt", padding=True)
    assert tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True) == targets  # beam 2, the recipe's
    assert "trust_remote_code=True" in (folder / "README.md").read_text(encoding="utf-8")


def test_an_imported_marian_model_keeps_its_generation_settings_and_generates_as_the_original(tmp_path):
    build_marian(tmp_path / "marian", Variant(generation=True), seed=3)  # forced EOS, bad words, its cap
    import_marian(str(tmp_path / "marian"), tmp_path / "run")
    folder = export_transformers(tmp_path / "run", tmp_path / "hf")
    with gzip.open(SHARED / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as lines:
        sources = [line.strip() for line in itertools.islice(lines, 20)]

    def greedy(path, **limit):
        tokenizer, model = load(path)
        outputs = [model.generate(**tokenizer([line], return_tensors="pt"), num_beams=1, **limit)[0] for line in sources]
        return [tokenizer.decode(ids, skip_special_tokens=True) for ids in outputs], [len(ids) for ids in outputs]

    for limit in ({}, {"max_new_tokens": 6}):  # the original's own cap (max_length 24), and one most outputs reach
        (theirs, lengths), (ours, _) = greedy(tmp_path / "marian", **limit), greedy(folder, **limit)
        assert ours == theirs
        assert lengths.count(limit.get("max_new_tokens", 23) + 1) >= 5  # ended by the forced EOS at the cap
    generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["forced_eos_token_id"] == generation["eos_token_id"] and generation["max_length"] == 24
