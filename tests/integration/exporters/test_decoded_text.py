"""`mtkit export --format transformers` judged on decoded text, as transformers users read a translation:
`tokenizer.batch_decode(model.generate(...), skip_special_tokens=True)` from the exported folder must equal mtkit's
own translation, whatever pieces the SentencePiece models hold. An OPUS-MT model's may hold no `<s>` piece: the
decoder's start (mtkit's BOS) is then no piece SentencePiece knows, and only a special token is dropped."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from helpers import write_multi30k_slice
from marian_builder import Variant, build_marian

from mtkit.config import Config, ModelConfig
from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, TokenizerPair, train_sentencepiece
from mtkit.decoding.engine import output_cap
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.exporters.transformers import export_transformers
from mtkit.importers.loader import Imported, write_run
from mtkit.importers.marian import import_marian
from mtkit.models import build_model

transformers = pytest.importorskip("transformers")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("hf_modules_cache"),  # shared_fixtures.py
    pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses"),
]

SOURCES = ["A man rides a bike in the park.", "Two dogs play.", "Children!"]
MARIAN_VARIANTS = {
    "marian-spm-without-<s>": Variant(bos_piece=False),
    "marian-spm-with-<s>": Variant(),
    "marian-separate-vocabularies-without-<s>": Variant(bos_piece=False, separate=True),
}
OWN = "mtkit-pre-norm"  # mtkit's own recipe: the remote-code form, a SentencePiece model of mtkit's (it holds <s>)


def own_run(root: Path) -> Path:
    """A tiny pre-norm mtkit Transformer with random weights and a joint SentencePiece model trained by mtkit."""
    lines = write_multi30k_slice(root / "train.en", "train", "en", 2000).read_text(encoding="utf-8").splitlines()
    tokenizer = train_sentencepiece(lines, vocab_size=100, model_type="unigram")
    model_config = ModelConfig(arch="transformer", layers=2, d_model=16, heads=2, ffn_dim=32, dropout=0.0)
    config = Config(name="own", src_lang="en", tgt_lang="de", model=model_config)
    torch.manual_seed(0)
    model = build_model(model_config, tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, share_vocab=True)
    for parameter in model.parameters():
        torch.nn.init.normal_(parameter, std=0.5)
    write_run(Imported(config=config, tokenizers=TokenizerPair(tokenizer, tokenizer), model=model), root / "run", source="random")
    return root / "run"


@pytest.fixture(scope="module", params=[*MARIAN_VARIANTS, OWN])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the run directory, its transformers export): an imported tiny OPUS-MT-like model, or mtkit's own."""
    root = tmp_path_factory.mktemp("decoded")
    if request.param == OWN:
        run = own_run(root)
    else:
        build_marian(root / "marian", MARIAN_VARIANTS[request.param], seed=3)
        run = root / "run"
        import_marian(str(root / "marian"), run)
    return run, export_transformers(run, root / "hf")


def load(folder: Path):  # noqa: ANN201 - transformers' tokenizer and model
    """The folder as its model card loads it: MarianTokenizer, and MarianMTModel or mtkit's remote code."""
    remote = (folder / "modeling_mtkit.py").is_file()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=remote)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=remote).eval()
    assert type(tokenizer).__name__ == "MarianTokenizer"
    assert remote or type(model).__name__ == "MarianMTModel"
    return tokenizer, model


def test_batch_decode_of_greedy_generate_is_mtkits_translation(exported) -> None:
    run, folder = exported
    translator = Translator.load(run, fast_paths=False)
    mine = [found[0] for found in translator.translate_nbest(SOURCES, Decoding(beam=1))]
    assert all(UNK_ID not in t.tokens for t in mine)  # transformers drops <unk> too; mtkit writes ⁇: keep it out
    tokenizer, model = load(folder)
    outputs = []
    for line in SOURCES:
        batch = tokenizer([line], return_tensors="pt")
        cap = output_cap(batch["input_ids"].size(1), translator.decode, max_positions=translator.engine.max_positions)
        outputs.append(model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=cap)[0].tolist())
    assert [[i for i in ids[1:] if i != EOS_ID] for ids in outputs] == [t.tokens for t in mine]
    assert all(ids[0] == BOS_ID for ids in outputs)  # every output starts with the decoder's start piece
    assert tokenizer.batch_decode(outputs, skip_special_tokens=True) == [t.text for t in mine]


def test_any_target_pieces_decode_to_mtkits_text(exported) -> None:
    run, folder = exported
    tokenizers = Translator.load(run, fast_paths=False).tokenizers
    tokenizer, _ = load(folder)
    draw = random.Random(0)
    regular = [i for i in range(EOS_ID + 1, tokenizers.tgt.vocab_size) if i not in tokenizers.tgt.reserved_ids]
    rows = [[BOS_ID, *draw.choices(regular, k=draw.randint(1, 8)), EOS_ID] for _ in range(300)]
    padded = [row + [PAD_ID] * (10 - len(row)) for row in rows]  # as generate pads a batch
    assert tokenizer.batch_decode(padded, skip_special_tokens=True) == [tokenizers.tgt.decode(row) for row in rows]


def test_the_start_piece_is_special_and_the_ids_are_unchanged(exported) -> None:
    run, folder = exported
    tokenizers = Translator.load(run, fast_paths=False).tokenizers
    tokenizer, _ = load(folder)
    assert tokenizer.bos_token == "<s>" and tokenizer.convert_tokens_to_ids("<s>") == BOS_ID
    assert BOS_ID in tokenizer.all_special_ids and len(tokenizer) == tokenizers.src.vocab_size  # no piece added
    for line in SOURCES:
        assert tokenizer(line)["input_ids"] == [*tokenizers.src.encode(line), EOS_ID]
