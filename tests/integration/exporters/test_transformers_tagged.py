"""`mtkit export --format transformers` of a tagged (multilingual) run: the target language is the source's first
token, as in OPUS-MT's multilingual models. A file of its own so that it runs in the worker that trains the
tagged run for the multilingual tests (tests/conftest.py groups by trained fixture)."""

from __future__ import annotations

import json

import pytest

from mtkit.decoding.translator import Translator
from mtkit.exporters.transformers import export_transformers

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("hf_modules_cache")]  # shared_fixtures.py


def test_a_tagged_model_takes_the_target_language_as_its_first_token(tagged_run, tmp_path):
    folder = export_transformers(tagged_run.run_path, tmp_path / "hf")
    vocabulary = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    translator = Translator.load([tagged_run.run_path])
    assert vocabulary[">>rv<<"] == translator.tokenizers.src.tags["rv"] and "<2rv>" not in vocabulary
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    ids = tokenizer([">>rv<< a b c"])["input_ids"][0]
    assert ids == [translator.tokenizers.src.tags["rv"], *translator.tokenizers.src.encode("a b c"), 3]
    batch = tokenizer([">>rv<< a b c d", ">>cp<< a b c d"], return_tensors="pt", padding=True)
    assert tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True) == ["d c b a", "a b c d"]
    assert "`>>cp<<`" in (folder / "README.md").read_text(encoding="utf-8")
