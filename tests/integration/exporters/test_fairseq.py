"""`mtkit export --format transformers` of imported NLLB-200, M2M-100 and mBART-50 models against `transformers`: the
folder loads in the family's own class and tokenizer (no remote code) and gives mtkit's log-probabilities of a
reference, greedy tokens and decoded text for two target languages."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from fairseq_builder import Built, build
from helpers import assert_one_line_error, cli_output, invoke

from mtkit.data.tokenizer import BOS_ID
from mtkit.decoding.engine import output_cap
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.importers.fairseq import fairseq_vocab
from mtkit.models.checkpoint import read_checkpoint, save_checkpoint

pytest.importorskip("transformers")

SOURCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Gras.", "Kinder!", "Eine Frau sitzt auf einer Bank im Park."]
TARGETS = ["A man rides a bike.", "Two dogs play.", "Children!", "A woman sits."]
CLASSES = {
    "nllb": ("M2M100ForConditionalGeneration", "NllbTokenizer"),
    "m2m100": ("M2M100ForConditionalGeneration", "M2M100Tokenizer"),
    "mbart": ("MBartForConditionalGeneration", "MBart50Tokenizer"),
}


@dataclasses.dataclass(frozen=True)
class Exported:
    built: Built  # the family's model as built (its languages)
    translator: Translator  # mtkit over the import
    model: object  # transformers' model loaded from the export
    tokenizer: object  # the family's tokenizer loaded from the export
    folder: Path  # the export
    run: Path  # the import


@pytest.fixture(scope="module", params=["nllb", "m2m100", "mbart"])
def exported(request, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    root = tmp_path_factory.mktemp(request.param)
    built = build(request.param, root / "hf")
    cli_output("import", "auto", str(built.folder), "-o", str(root / "run"))
    said = cli_output("export", "-m", str(root / "run"), "-o", str(root / "out"), "--format", "transformers")
    assert str(root / "out") in said
    translator = Translator.load(root / "run")
    translator.decode = dataclasses.replace(translator.decode, max_len_a=0.5, max_len_b=4)  # short outputs: quick tests
    model = AutoModelForSeq2SeqLM.from_pretrained(root / "out").eval()
    tokenizer = AutoTokenizer.from_pretrained(root / "out")
    return Exported(built, translator, model, tokenizer, root / "out", root / "run")


def _code(tokenizer: object, lang: str) -> int:
    """The tokenizer's id of a language (M2M100Tokenizer names __de__ de)."""
    return tokenizer.convert_tokens_to_ids(f"__{lang}__" if "_" not in lang and len(lang) < 4 else lang)


def test_the_folder_is_the_familys_own_class_and_tokenizer(exported: Exported, request) -> None:
    family = request.node.callspec.params["exported"]
    model_class, tokenizer_class = CLASSES[family]
    assert type(exported.model).__name__ == model_class and type(exported.tokenizer).__name__ == tokenizer_class
    assert not list(exported.folder.glob("*.py"))  # no remote code
    vocab = exported.tokenizer.get_vocab()  # the import's ids, as built (M2M100Tokenizer's lists its codes too)
    assert {piece: vocab.get(piece) for piece in exported.built.tokenizer.get_vocab()} == exported.built.tokenizer.get_vocab()
    for lang in (exported.built.src_lang, *exported.built.tgt_langs):
        assert _code(exported.tokenizer, lang) == _code(exported.built.tokenizer, lang)
    generation = json.loads((exported.folder / "generation_config.json").read_text())
    assert generation["decoder_start_token_id"] == 2 and "forced_bos_token_id" not in generation
    card = (exported.folder / "README.md").read_text()
    assert model_class in card and "forced_bos_token_id" in card and "trust_remote_code" not in card


def _reference_log_prob(exported: Exported, source: str, target: str) -> tuple[int, float]:
    """transformers' (tokens, log-probability) of `target` given `source`, the tokenizer's languages set."""
    batch = exported.tokenizer(source, text_target=target, return_tensors="pt")
    labels = batch["labels"]
    with torch.no_grad():
        log_probs = torch.log_softmax(exported.model(input_ids=batch["input_ids"], labels=labels).logits[0], dim=-1)
    return labels.size(1), log_probs.gather(1, labels[0].unsqueeze(1)).sum().item()


def test_log_probabilities_are_mtkits_within_1e_4(exported: Exported) -> None:
    exported.tokenizer.src_lang = exported.built.src_lang
    for lang in exported.built.tgt_langs:
        exported.tokenizer.tgt_lang = lang
        scores = exported.translator.score(SOURCES, TARGETS, tgt_lang=lang, src_lang=exported.built.src_lang)
        expected = [_reference_log_prob(exported, source, target) for source, target in zip(SOURCES, TARGETS, strict=True)]
        assert [score.tokens for score in scores] == [tokens for tokens, _ in expected]
        assert [score.log_prob for score in scores] == pytest.approx([value for _, value in expected], abs=1e-4)


def test_greedy_generate_gives_mtkits_tokens_and_text(exported: Exported) -> None:
    translator, tokenizer = exported.translator, exported.tokenizer
    order = fairseq_vocab(translator.tokenizers.tgt.table or []).order
    mtkit_id = {fairseq: mine for mine, fairseq in enumerate(order) if mine != BOS_ID}  # </s> is EOS, not BOS
    tokenizer.src_lang = exported.built.src_lang
    for lang in exported.built.tgt_langs:
        found = translator.translate_nbest(SOURCES, Decoding(beam=1, tgt_lang=lang, src_lang=exported.built.src_lang))
        for source, (best,) in zip(SOURCES, found, strict=True):
            inputs = tokenizer(source, return_tensors="pt")
            cap = output_cap(inputs["input_ids"].size(1), translator.decode, max_positions=10**6)
            output = exported.model.generate(
                **inputs, num_beams=1, do_sample=False, max_new_tokens=cap, forced_bos_token_id=_code(tokenizer, lang)
            )
            generated = output[0, 1:].tolist()  # without the decoder's start
            assert generated[0] == _code(tokenizer, lang)
            assert [mtkit_id[i] for i in generated if i != 2][:cap] == best.tokens
            assert tokenizer.batch_decode(output, skip_special_tokens=True) == [best.text]


def test_the_cli_translation_is_the_decoded_text(exported: Exported, tmp_path: Path) -> None:
    lang = exported.built.tgt_langs[1]
    (tmp_path / "in.txt").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    flags = ["--src-lang", exported.built.src_lang, "--tgt-lang", lang, "--beam", "1"]
    cli_output("translate", "-m", str(exported.run), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.txt"), *flags)
    tokenizer = exported.tokenizer
    tokenizer.src_lang = exported.built.src_lang
    decode, decoded = Translator.load(exported.run).decode, []  # the recipe's output cap, as the CLI's
    for source in SOURCES:
        inputs = tokenizer(source, return_tensors="pt")
        cap = output_cap(inputs["input_ids"].size(1), decode, max_positions=10**6)
        output = exported.model.generate(**inputs, num_beams=1, max_new_tokens=cap, forced_bos_token_id=_code(tokenizer, lang))
        decoded += tokenizer.batch_decode(output, skip_special_tokens=True)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == decoded


def test_an_export_replaces_an_earlier_one_only_with_force(exported: Exported, tmp_path: Path) -> None:
    cli_output("export", "-m", str(exported.run), "-o", str(tmp_path / "again"), "--format", "transformers")
    assert (tmp_path / "again" / "model.safetensors").is_file()
    refused = invoke("export", "-m", str(exported.run), "-o", str(tmp_path / "again"), "--format", "transformers")
    assert_one_line_error(refused, "--force")
    flags = ["--format", "transformers", "--force"]
    cli_output("export", "-m", str(exported.run), "-o", str(tmp_path / "again"), *flags)
    assert json.loads((tmp_path / "again" / "mtkit_export.json").read_text())["form"] in CLASSES


def _changed_run(run: Path, folder: Path, name: str, change: float) -> Path:
    """A copy of the run's checkpoint with one tensor's row changed: BOS's embedding row, or an output bias."""
    payload = read_checkpoint(run / "best.pt")
    weights = payload["model"]
    key, row = ("src_embed.embedding.weight", BOS_ID) if name == "bos" else ("output.bias", 10)
    for tied in {key} | ({"tgt_embed.embedding.weight", "output.weight"} if name == "bos" else set()):
        if tied in weights:
            weights[tied] = weights[tied].clone()
            weights[tied][row] += change
    save_checkpoint(payload, folder / "changed.pt")
    return folder / "changed.pt"


def test_a_piece_added_after_the_import_is_refused_in_one_line(exported: Exported, tmp_path: Path) -> None:
    """What `--extend-vocab` does: a piece after the table's last, which the family's tokenizer would not build."""
    payload = read_checkpoint(exported.run / "best.pt")
    for side in ("src_pieces", "tgt_pieces"):
        payload["tokenizers"][side] = [*payload["tokenizers"][side], "\u2581Fahrradweg"]
    for name, tensor in payload["model"].items():
        if name in ("src_embed.embedding.weight", "tgt_embed.embedding.weight", "output.weight", "output.bias"):
            payload["model"][name] = torch.cat([tensor, tensor[-1:]])
    save_checkpoint(payload, tmp_path / "extended.pt")
    export = ["export", "-m", str(tmp_path / "extended.pt"), "-o", str(tmp_path / "out"), "--format", "transformers"]
    assert_one_line_error(invoke(*export), "builds from its SentencePiece model", "--format ctranslate2")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["bos", "bias"])
def test_what_the_class_cannot_hold_is_refused_in_one_line(exported: Exported, tmp_path: Path, name: str, request) -> None:
    family = request.node.callspec.params["exported"]
    checkpoint = _changed_run(exported.run, tmp_path, name, 0.5)
    export = ["export", "-m", str(checkpoint), "-o", str(tmp_path / "out"), "--format", "transformers"]
    if name == "bias" and family == "mbart":  # its class holds an output bias (final_logits_bias)
        cli_output(*export)
        assert (tmp_path / "out" / "model.safetensors").is_file()
        return
    assert_one_line_error(invoke(*export), "BOS and EOS rows differ" if name == "bos" else "output bias")
    assert not (tmp_path / "out").exists()


def test_ctranslate2s_own_converter_reads_the_folder(exported: Exported, tmp_path: Path) -> None:
    """`ct2-transformers-converter` of the export, given the family's tokens, writes mtkit's greedy text."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter

    TransformersConverter(str(exported.folder)).convert(str(tmp_path / "ct2"))
    converted, tokenizer, src_lang = (
        ctranslate2.Translator(str(tmp_path / "ct2"), intra_threads=1),
        exported.tokenizer,
        exported.built.src_lang,
    )
    tokenizer.src_lang = src_lang
    for lang in exported.built.tgt_langs:
        found = exported.translator.translate_nbest(SOURCES, Decoding(beam=1, tgt_lang=lang, src_lang=src_lang))
        for source, (best,) in zip(SOURCES, found, strict=True):
            ids = tokenizer(source)["input_ids"]
            cap = output_cap(len(ids), exported.translator.decode, max_positions=10**6)
            prefix = [tokenizer.convert_ids_to_tokens(_code(tokenizer, lang))]
            result = converted.translate_batch(
                [tokenizer.convert_ids_to_tokens(ids)], target_prefix=[prefix], beam_size=1, max_decoding_length=cap
            )
            hypothesis = tokenizer.convert_tokens_to_ids(result[0].hypotheses[0])
            assert tokenizer.decode(hypothesis, skip_special_tokens=True) == best.text


def test_the_export_writes_the_family_the_run_records(exported: Exported, tmp_path: Path, request) -> None:
    """The family comes from the run's record (tokenizer.family, written by the import), not from its language codes:
    a run imported before the record exports as before, and a record of another family is refused in one line."""
    family = request.node.callspec.params["exported"]
    payload = read_checkpoint(exported.run / "best.pt")
    assert payload["config"]["tokenizer"]["family"] == family
    payload["config"]["tokenizer"]["family"] = None
    save_checkpoint(payload, tmp_path / "unrecorded.pt")
    cli_output("export", "-m", str(tmp_path / "unrecorded.pt"), "-o", str(tmp_path / "old"), "--format", "transformers")
    for name in ("config.json", "tokenizer_config.json", "generation_config.json"):
        assert json.loads((tmp_path / "old" / name).read_text()) == json.loads((exported.folder / name).read_text())
    other, refusal = {"nllb": ("m2m100", "M2M100Tokenizer builds"), "m2m100": ("nllb", "NllbTokenizer builds")}.get(
        family, ("nllb", "the model lacks that family's keys")
    )
    payload["config"]["tokenizer"]["family"] = other
    save_checkpoint(payload, tmp_path / "other.pt")
    refused = invoke("export", "-m", str(tmp_path / "other.pt"), "-o", str(tmp_path / "out"), "--format", "transformers")
    assert_one_line_error(refused, refusal)
    assert not (tmp_path / "out").exists()


def test_an_nllb_model_holding_fairseqs_four_specials_as_pieces_exports_and_generates_as_the_original(tmp_path) -> None:
    """NllbTokenizer takes fairseq's four specials once, then the SentencePiece model's other pieces: a model that holds
    the four as its first pieces (not the usual <unk>, <s>, </s>) gives the table mtkit imported, which is exported."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    built = build("nllb", tmp_path / "hf", four_specials=True)
    cli_output("import", "auto", str(built.folder), "-o", str(tmp_path / "run"))
    cli_output("export", "-m", str(tmp_path / "run"), "-o", str(tmp_path / "out"), "--format", "transformers")
    model, tokenizer = (
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out").eval(),
        AutoTokenizer.from_pretrained(tmp_path / "out"),
    )
    assert tokenizer.get_vocab() == built.tokenizer.get_vocab()
    translator = Translator.load(tmp_path / "run")
    for lang in built.tgt_langs:
        found = translator.translate_nbest(SOURCES, Decoding(beam=1, tgt_lang=lang, src_lang=built.src_lang))
        for source, (best,) in zip(SOURCES, found, strict=True):
            inputs = tokenizer(source, return_tensors="pt")
            cap = output_cap(inputs["input_ids"].size(1), translator.decode, max_positions=10**6)
            greedy = {"num_beams": 1, "do_sample": False, "max_new_tokens": cap, "forced_bos_token_id": _code(tokenizer, lang)}
            ours, theirs = model.generate(**inputs, **greedy), built.model.generate(**inputs, **greedy)
            assert ours.tolist() == theirs.tolist()
            assert tokenizer.batch_decode(ours, skip_special_tokens=True) == [best.text]
