"""`mtkit import auto` of NLLB-200, M2M-100 and mBART-50 against `transformers` itself: tiny random models built
locally with each family's own tokenizer, their token ids, log-probabilities, greedy and beam-4 outputs for two
target languages compared with the library's, and what the import and the language flags refuse."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from fairseq_builder import Built, build
from helpers import assert_one_line_error, cli_output, invoke, recipe

from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import BOS_ID, EOS_ID
from mtkit.decoding.engine import output_cap
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError, OptionError
from mtkit.importers import import_model
from mtkit.importers.fairseq import fairseq_vocab

pytest.importorskip("transformers")

SOURCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Gras.",
    "Kinder!",
    "Eine Frau in einem roten Kleid sitzt auf einer Bank im Park.",
    "Ein Junge springt ins Wasser.",
    "Menschen gehen auf der Straße.",
    "Ein Hund.",
    "Eine Gruppe von Männern spielt Fußball auf einem Feld.",
]
TARGETS = ["A man rides a bike.", "Two dogs play.", "Children!", "A woman sits.", "A boy.", "People.", "A dog.", "Men."]


@pytest.fixture(scope="module", params=["nllb", "m2m100", "mbart"])
def imported(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, Translator, dict[int, int]]:
    """(the family's model and tokenizer as built, mtkit's translator over its import, fairseq id -> mtkit id)."""
    root = tmp_path_factory.mktemp(request.param)
    built = build(request.param, root / "hf")
    config, _ = import_model(str(built.folder), root / "run")
    assert config.data.lang_tag == "code" and config.src_lang == built.src_lang
    translator = Translator.load(root / "run")
    translator.decode = dataclasses.replace(translator.decode, max_len_a=0.5, max_len_b=4)  # short outputs: quick tests
    order = fairseq_vocab(translator.tokenizers.tgt.table or []).order
    mtkit_id = {fairseq: mine for mine, fairseq in enumerate(order) if mine != BOS_ID}  # </s> is EOS, not BOS
    return built, translator, mtkit_id


def _code(built: Built, lang: str) -> int:
    """The tokenizer's id of a language (M2M100Tokenizer names __de__ de)."""
    return built.tokenizer.convert_tokens_to_ids(f"__{lang}__" if "_" not in lang and len(lang) < 4 else lang)


def test_token_ids_are_the_family_tokenizers(imported) -> None:
    built, translator, mtkit_id = imported
    tokenizer, codes = built.tokenizer, translator.tokenizers.src.codes
    tokenizer.src_lang = built.src_lang
    for lang in built.tgt_langs:
        tokenizer.tgt_lang = lang
        for source, target in zip(SOURCES, TARGETS, strict=True):
            ids = tokenizer(source, text_target=target)
            assert [mtkit_id[i] for i in ids["input_ids"]] == [
                codes[built.src_lang],
                *translator.tokenizers.src.encode(source),
                EOS_ID,
            ]
            assert [mtkit_id[i] for i in ids["labels"]] == [codes[lang], *translator.tokenizers.tgt.encode(target), EOS_ID]


def test_scores_are_transformers_log_probabilities_within_1e_4(imported) -> None:
    built, translator, _ = imported
    tokenizer = built.tokenizer
    tokenizer.src_lang = built.src_lang
    for lang in built.tgt_langs:
        tokenizer.tgt_lang = lang
        scores = translator.score(SOURCES, TARGETS, tgt_lang=lang, src_lang=built.src_lang)
        for source, target, score in zip(SOURCES, TARGETS, scores, strict=True):
            batch = tokenizer(source, text_target=target, return_tensors="pt")
            with torch.no_grad():
                logits = built.model(input_ids=batch["input_ids"], labels=batch["labels"]).logits
            expected = torch.log_softmax(logits[0], dim=-1).gather(1, batch["labels"][0].unsqueeze(1)).sum().item()
            assert score.tokens == batch["labels"].size(1)
            assert score.log_prob == pytest.approx(expected, abs=1e-4)


def _generated(built: Built, translator: Translator, lang: str, beam: int) -> list[tuple[list[int], bool, int]]:
    """transformers' output of each source (its ids, whether it ended with </s> before the cap, the cap)."""
    found = []
    built.tokenizer.src_lang = built.src_lang
    for source in SOURCES:
        inputs = built.tokenizer(source, return_tensors="pt")
        cap = output_cap(inputs["input_ids"].size(1), translator.decode, max_positions=10**6)
        output = built.model.generate(
            **inputs, num_beams=beam, do_sample=False, max_new_tokens=cap, forced_bos_token_id=_code(built, lang),
            bad_words_ids=[[1]], forced_eos_token_id=None, early_stopping=True,
        )[0, 1:].tolist()  # fmt: skip
        found.append((output, 2 in output, cap))
    return found


def _expected(generated: list[int], mtkit_id: dict[int, int], cap: int) -> list[int]:
    return [mtkit_id[i] for i in generated if i != 2][:cap]  # without </s>, cut where mtkit's output cap cuts


def test_greedy_outputs_are_generate_with_the_forced_code(imported) -> None:
    built, translator, mtkit_id = imported
    for lang in built.tgt_langs:
        found = translator.translate_nbest(SOURCES, Decoding(beam=1, tgt_lang=lang, src_lang=built.src_lang))
        for (best,), (generated, _, cap) in zip(found, _generated(built, translator, lang, 1), strict=True):
            assert best.tokens == _expected(generated, mtkit_id, cap)


def test_beam_4_outputs_are_generate_where_it_ends_before_the_cap(imported) -> None:
    """At the output cap mtkit forces </s> (scoring it) where transformers stops without it, so the outputs that end
    there are left out; the random models end most before it."""
    built, translator, mtkit_id = imported
    compared = 0
    for lang in built.tgt_langs:
        found = translator.translate_nbest(SOURCES, Decoding(beam=4, tgt_lang=lang, src_lang=built.src_lang))
        for (best,), (generated, ended, cap) in zip(found, _generated(built, translator, lang, 4), strict=True):
            if ended:
                assert best.tokens == _expected(generated, mtkit_id, cap)
                compared += 1
    assert compared >= 4


def test_language_flags_take_iso_639_1_codes_and_name_the_closest(imported) -> None:
    built, translator, _ = imported
    assert built.tgt_langs[1] in ("fra_Latn", "fr", "fr_XX")
    with_code = translator.translate_nbest(SOURCES[:2], Decoding(beam=1, tgt_lang=built.tgt_langs[1]))
    assert translator.translate_nbest(SOURCES[:2], Decoding(beam=1, tgt_lang="fr")) == with_code
    with pytest.raises(OptionError, match=r"--tgt-lang xx_Latn: the model has no such language code; the closest") as raised:
        translator.translate(SOURCES[:1], tgt_lang="xx_Latn")
    assert "\n" not in str(raised.value)
    with pytest.raises(OptionError, match="--src-lang"):
        translator.translate_nbest(SOURCES[:1], Decoding(src_lang="qq", tgt_lang="fr"))
    with pytest.raises(OptionError, match=r"this model writes \d+ languages: choose one with --tgt-lang, such as --tgt-lang fr"):
        translator.translate(SOURCES[:1])  # the tokenizer named no target language


def test_the_cli_imports_and_translates_with_language_flags(imported, tmp_path: Path) -> None:
    built, translator, _ = imported
    said = cli_output("import", "auto", str(built.folder), "-o", str(tmp_path / "run"))
    assert "imported" in said
    (tmp_path / "in.txt").write_text("\n".join(SOURCES[:3]) + "\n\n", encoding="utf-8")
    lang = built.tgt_langs[0]
    flags = ["-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.txt"), "--src-lang", built.src_lang, "--tgt-lang", lang]
    cli_output("translate", "-m", str(tmp_path / "run"), *flags, "--beam", "1")
    expected = [
        found[0].text for found in Translator.load(tmp_path / "run").translate_nbest(SOURCES[:3], Decoding(beam=1, tgt_lang=lang))
    ]
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == [*expected, ""]
    assert_one_line_error(invoke("translate", "-m", str(tmp_path / "run"), *flags[:4], "--tgt-lang", "qqq_Zzzz"), "qqq_Zzzz")
    (tmp_path / "ref.txt").write_text("\n".join(TARGETS[:3]) + "\n", encoding="utf-8")
    (tmp_path / "src.txt").write_text("\n".join(SOURCES[:3]) + "\n", encoding="utf-8")
    scored = cli_output(
        "score", "-m", str(tmp_path / "run"), "--src", str(tmp_path / "src.txt"), "--tgt", str(tmp_path / "ref.txt"), *flags[4:]
    )
    expected_scores = translator.score(SOURCES[:3], TARGETS[:3], tgt_lang=lang, src_lang=built.src_lang)
    assert scored.splitlines() == [score.line() for score in expected_scores]
    files = ["--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt")]
    evaluated = cli_output("evaluate", "-m", str(tmp_path / "run"), *files, *flags[4:])
    assert "BLEU" in evaluated and lang in evaluated


def test_weights_that_do_not_fit_config_json_are_one_line(imported, tmp_path: Path) -> None:
    built, _, _ = imported
    for key, change in (("d_model", 8), ("vocab_size", 1)):
        folder = tmp_path / key
        shutil.copytree(built.folder, folder)
        settings = json.loads((folder / "config.json").read_text())
        bigger = {**settings, key: settings[key] + change}
        (folder / "config.json").write_text(json.dumps(bigger))
        with pytest.raises(MtkitError, match="do not fit config.json") as raised:
            import_model(str(folder), tmp_path / f"{key}-run")
        assert "\n" not in str(raised.value) and not (tmp_path / f"{key}-run").exists()


def test_fine_tuning_an_imported_run_prepares_pairs_with_its_codes(imported, tmp_path: Path) -> None:
    built, translator, _ = imported
    cli_output("import", "auto", str(built.folder), "-o", str(tmp_path / "run"))
    corpus = {"src": str(tmp_path / "in.de"), "tgt": str(tmp_path / "in.en")}
    texts = {"de": "Ein Hund.", "en": "A dog."}
    for side, text in texts.items():
        (tmp_path / f"in.{side}").write_text(text + "\n", encoding="utf-8")
    values = recipe("child", tmp_path / "child", src_lang="de", tgt_lang="en", data={"train": corpus, "valid": corpus})
    values |= {"model": None, "train": {"init_from": str(tmp_path / "run"), "threads": 1}}
    (tmp_path / "child.yaml").write_text(yaml.safe_dump({k: v for k, v in values.items() if v is not None}), encoding="utf-8")
    cli_output("prepare", str(tmp_path / "child.yaml"))
    prepared = load_prepared(tmp_path / "child" / "data", "train")
    codes, tokenizer = translator.tokenizers.src.codes, translator.tokenizers.src
    source, target = (built.src_lang, built.tgt_langs[0])  # de and en name them
    assert prepared["src_ids"][0] == [codes[source], *tokenizer.encode(texts["de"])]
    assert prepared["tgt_ids"][0] == [codes[target], *tokenizer.encode(texts["en"])]
