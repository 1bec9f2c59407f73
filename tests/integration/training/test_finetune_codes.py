"""Fine-tuning an imported NLLB-200, M2M-100 or mBART-50 run (`train.init_from` on a run with `data.lang_tag: code`)
against `transformers` itself: the prepared pairs are the family tokenizer's ids, mtkit's loss is transformers' loss
with `labels`, the </s> rows stay one row, the step-0 baseline is logged, a fine-tuned NLLB run exports, and a new
language code (`data.new_languages`) trains, is chosen with --tgt-lang and leaves the old codes' outputs as they were."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch
import yaml
from fairseq_builder import Built, build
from helpers import assert_one_line_error, cli_output, invoke, recipe, write_multi30k_slice

from mtkit.config import load_config
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import BOS_ID, EOS_ID, load_tokenizers
from mtkit.decoding.engine import PyTorchEngine
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.models import build_model
from mtkit.models.checkpoint import load_model, read_checkpoint
from mtkit.training.batches import collate
from mtkit.training.finetune import load_parent
from mtkit.training.loss import sequence_loss

pytest.importorskip("transformers")

SOURCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Gras.", "Kinder!", "Ein Hund."]
PAIRS = 40  # training and validation pairs of each child


def _child(root: Path, parent: Path, built: Built, tgt_lang: str, **data: object) -> Path:
    """A fine-tuning recipe over Multi30k German -> English pairs, the target named `tgt_lang`."""
    sides = [
        write_multi30k_slice(root / f"all.{lang}", "train", lang, 10 * PAIRS).read_text(encoding="utf-8")
        for lang in "de en".split()
    ]
    short = [pair for pair in zip(*(text.splitlines() for text in sides), strict=True) if len(" ".join(pair).split()) <= 16]
    files = {}
    for index, side in enumerate(("src", "tgt")):  # short pairs: within the tiny mBART's 64 learned positions
        files[side] = str(root / f"train.{side}")
        Path(files[side]).write_text("".join(pair[index] + "\n" for pair in short[:PAIRS]), encoding="utf-8")
    train = {"init_from": str(parent), "max_steps": 3, "validate_every": 3, "lr": 0.001, "warmup_steps": 1, "valid_beam": 1}
    data = {"train": files, "valid": files, **data}
    values = recipe(
        "child", root, src_lang=built.src_lang, tgt_lang=tgt_lang, data=data, decode={"max_len_a": 0.5, "max_len_b": 4}
    )
    values |= {"model": None, "tokenizer": None, "train": {**values["train"], **train}}
    path = root / "child.yaml"
    path.write_text(yaml.safe_dump({key: value for key, value in values.items() if value is not None}), encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=["nllb", "m2m100", "mbart"])
def child(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, Path, Path]:
    """(the family's model as built, its imported run, a fine-tuning recipe prepared and trained for 3 updates)."""
    root = tmp_path_factory.mktemp(request.param)
    built = build(request.param, root / "hf")
    cli_output("import", "auto", str(built.folder), "-o", str(root / "parent"))
    path = _child(root, root / "parent", built, built.tgt_langs[0])
    cli_output("prepare", str(path))
    cli_output("train", str(path))
    return built, root / "parent", path


def test_prepared_pairs_and_the_loss_are_the_family_tokenizers_and_transformers(child) -> None:
    built, parent, path = child
    config = load_config(path)
    tokenizers = load_tokenizers(config.data_path, joint=True)
    train = load_prepared(config.data_path, "train")
    model = build_model(
        config.model, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=True
    ).eval()
    load_parent(model, read_checkpoint(parent), parent=str(parent), tokenizers=tokenizers, config=config)
    batch = collate(list(train["src_ids"]), list(train["tgt_ids"]))
    with torch.no_grad():
        logits = model(batch.src, batch.src_mask, batch.tgt_in)
        mine = sequence_loss(logits, batch.tgt_out, label_smoothing=0.0).item() / batch.num_tokens
    built.tokenizer.src_lang, built.tokenizer.tgt_lang = built.src_lang, built.tgt_langs[0]
    theirs = built.tokenizer(list(train["src"]), text_target=list(train["tgt"]), return_tensors="pt", padding=True)
    labels = theirs["labels"].masked_fill(theirs["labels"] == 1, -100)  # the pads left out, as mtkit leaves them
    with torch.no_grad():
        loss = built.model(input_ids=theirs["input_ids"], attention_mask=theirs["attention_mask"], labels=labels).loss.item()
    assert mine == pytest.approx(loss, abs=1e-4)


def test_training_keeps_one_eos_row_and_the_output_bias_and_logs_the_step_0_baseline(child) -> None:
    built, parent, path = child
    config = load_config(path)
    before, after = (read_checkpoint(run)["model"] for run in (parent, config.run_path / "last.pt"))
    embedding = after["src_embed.embedding.weight"]
    assert not torch.equal(embedding, before["src_embed.embedding.weight"])  # trained
    assert torch.equal(embedding[BOS_ID], embedding[EOS_ID])
    assert torch.equal(after["output.bias"], before["output.bias"])
    records = [json.loads(line) for line in (config.run_path / "log.jsonl").read_text(encoding="utf-8").splitlines()]
    validated = [record for record in records if "valid_bleu" in record]
    assert validated[0]["step"] == 0 and validated[-1]["step"] == 3


def _assert_exported_generate_is_greedy(run: Path, folder: Path, src_lang: str, lang: str) -> None:
    """transformers' generate (forced_bos_token_id: `lang`'s code) of the export in `folder`, with its own tokenizer,
    gives mtkit's greedy text of `run` where it ends before mtkit's output cap (which forces </s>), and else its start."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    translator = Translator.load(run)
    translator.decode = dataclasses.replace(translator.decode, max_len_a=0.5, max_len_b=4)
    found = translator.translate_nbest(SOURCES, Decoding(beam=1, tgt_lang=lang, src_lang=src_lang))
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer.src_lang = src_lang
    code = tokenizer.convert_tokens_to_ids(f"__{lang}__" if len(lang) == 2 else lang)
    assert code != tokenizer.unk_token_id
    for source, (best,) in zip(SOURCES, found, strict=True):
        inputs = tokenizer(source, return_tensors="pt")
        output = model.generate(
            **inputs, num_beams=1, do_sample=False, max_new_tokens=4 + inputs["input_ids"].size(1) // 2,
            forced_bos_token_id=code, bad_words_ids=[[1]], forced_eos_token_id=None,
        )[0]  # fmt: skip
        text = tokenizer.decode(output, skip_special_tokens=True)
        # A trained model may write a special token that mtkit's text keeps and transformers' decode leaves out
        # (mBART's <mask>): it is left out of both.
        expected = functools.reduce(lambda line, special: line.replace(special, ""), tokenizer.all_special_tokens, best.text)
        assert text == expected if 2 in output[1:].tolist() else expected.startswith(text.rsplit(" ", 1)[0])


def test_a_fine_tuned_run_exports_and_generate_gives_its_greedy_output(child, tmp_path: Path) -> None:
    built, _, path = child
    run = load_config(path).run_path
    cli_output("export", "-m", str(run), "--format", "transformers", "-o", str(tmp_path / "hf"))
    _assert_exported_generate_is_greedy(run, tmp_path / "hf", built.src_lang, built.tgt_langs[1])


def test_bad_corpus_codes_are_one_line_naming_the_closest(child, tmp_path: Path) -> None:
    built, parent, _ = child
    path = _child(tmp_path, parent, built, "qqq_Zzzz" if built.src_lang == "deu_Latn" else "qq")
    assert_one_line_error(invoke("prepare", str(path)), "tgt_lang", "no such language code", "closest")
    assert not (tmp_path / "data").exists()  # refused before anything is written


def test_a_fine_tuned_run_exports_to_ctranslate2_with_its_greedy_output(child, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    built, _, path = child
    run = load_config(path).run_path
    cli_output("export", "-m", str(run), "--format", "ctranslate2", "-o", str(tmp_path / "ct2"))
    pytorch, ctranslate2 = Translator.load(run), Translator.load(tmp_path / "ct2")
    assert type(ctranslate2.engine).__name__ == "CT2Engine"
    options = Decoding(beam=1, tgt_lang=built.tgt_langs[1], src_lang=built.src_lang)
    expected, found = (translator.translate_nbest(SOURCES, options) for translator in (pytorch, ctranslate2))
    assert [best.tokens for (best,) in found] == [best.tokens for (best,) in expected]


def test_a_lora_run_keeps_one_eos_row_and_its_merged_export_generates_its_greedy_output(child, tmp_path: Path) -> None:
    built, parent, _ = child
    path = _child(tmp_path, parent, built, built.tgt_langs[0])
    recipe_values = yaml.safe_load(path.read_text(encoding="utf-8"))
    targets = ["qkv", "query", "key_value", "out", "inner", "outer", "embedding"]
    recipe_values["train"] |= {"lr": 0.01, "lora": {"rank": 2, "targets": targets}}
    path.write_text(yaml.safe_dump(recipe_values), encoding="utf-8")
    cli_output("prepare", str(path))
    cli_output("train", str(path))
    run = load_config(path).run_path / "last.pt"  # best.pt may be step 0's: the adapters as they started
    model, _, _, _ = load_model(run, merged=True)
    rows = model.state_dict()["src_embed.embedding.weight"]
    assert torch.equal(rows[BOS_ID], rows[EOS_ID])
    assert not torch.equal(rows, read_checkpoint(parent)["model"]["src_embed.embedding.weight"])  # the adapters trained
    cli_output("export", "-m", str(run), "--format", "transformers", "-o", str(tmp_path / "hf"))
    _assert_exported_generate_is_greedy(run, tmp_path / "hf", built.src_lang, built.tgt_langs[1])


# each family's new code (named by its source language's name) and the code its row starts from
NEW_CODES = {"deu_Latn": ("xyz_Latn", "fra_Latn"), "de": ("xx", "fr"), "de_DE": ("xx_XX", "fr_XX")}
EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "nllb_finetune.yaml"


@pytest.fixture(scope="module")
def with_new_code(child, tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, Path, Path]:
    """The parent with a new code (`NEW_CODES`) added by `data.new_languages`, prepared for a corpus into it."""
    built, parent, _ = child
    new, related = NEW_CODES[built.src_lang]
    root = tmp_path_factory.mktemp("new-code")
    path = _child(root, parent, built, new, new_languages=f"{new}={related}")
    cli_output("prepare", str(path))
    return built, parent, path


def test_a_new_code_leaves_the_old_codes_outputs_at_step_0(with_new_code) -> None:
    built, parent, path = with_new_code
    new, related = NEW_CODES[built.src_lang]
    config = load_config(path)
    tokenizers = load_tokenizers(config.data_path, joint=True)
    codes = tokenizers.src.codes
    assert list(codes)[-1] == new
    assert tokenizers.src.vocab_size == read_checkpoint(parent)["model"]["output.bias"].numel() + 1
    model = build_model(
        config.model, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=True
    ).eval()
    load_parent(model, read_checkpoint(parent), parent=str(parent), tokenizers=tokenizers, config=config)
    rows = model.state_dict()["src_embed.embedding.weight"]
    assert torch.equal(rows[codes[new]], rows[codes[related]])
    child_translator = Translator(
        PyTorchEngine(model, torch.device("cpu")), tokenizers, decode=config.decode, normalize="none", config=config
    )
    parent_translator = Translator.load(parent)
    for translator in (child_translator, parent_translator):
        translator.decode = dataclasses.replace(translator.decode, max_len_a=0.5, max_len_b=4)
    for lang in built.tgt_langs:  # greedy: the new row lowers every log-probability of a step alike (beam: see the docs)
        decoding = Decoding(beam=1, tgt_lang=lang, src_lang=built.src_lang)
        ours, theirs = (t.translate_nbest(SOURCES, decoding) for t in (child_translator, parent_translator))
        assert [found[0].tokens for found in ours] == [found[0].tokens for found in theirs]


def test_a_new_code_trains_is_chosen_with_tgt_lang_and_exports_or_says_why_not(with_new_code, tmp_path: Path) -> None:
    built, _, path = with_new_code
    new = NEW_CODES[built.src_lang][0]
    run = load_config(path).run_path
    cli_output("train", str(path))
    (tmp_path / "in.txt").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    cli_output("translate", "-m", str(run), "-i", str(tmp_path / "in.txt"), "-o", str(out), "--tgt-lang", new)
    translator = Translator.load(run)
    expected = translator.translate(SOURCES, tgt_lang=new)
    assert out.read_text(encoding="utf-8").splitlines() == expected and new in translator.target_languages
    exported = invoke("export", "-m", str(run), "--format", "transformers", "-o", str(tmp_path / "hf"))
    if built.src_lang != "deu_Latn":  # M2M100Tokenizer and MBart50Tokenizer build their codes from a fixed list
        assert_one_line_error(exported, "--format ctranslate2")
        return
    assert exported.exit_code == 0, exported.output  # NllbTokenizer holds the new code as a special token
    _assert_exported_generate_is_greedy(run, tmp_path / "hf", built.src_lang, new)


def test_bad_new_codes_are_one_line_and_the_example_recipe_loads(with_new_code, tmp_path: Path) -> None:
    built, parent, _ = with_new_code
    if built.src_lang != "deu_Latn":
        pytest.skip("the NLLB model's codes")
    for value, needle in (
        ("deu_Latn=fra_Latn", "already"),
        ("xyz_Latn=qqq_Zzzz", "closest"),
        ("xyz=fra_Latn", "form"),
    ):
        path = _child(tmp_path, parent, built, "eng_Latn", new_languages=value)
        assert_one_line_error(invoke("prepare", str(path)), "data.new_languages", needle)
    example = load_config(EXAMPLE, [f"train.init_from={parent}"])
    assert example.data.lang_tag == "code" and example.train.checkpoint_activations and example.train.lr < 0.001
