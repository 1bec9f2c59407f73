"""`mtkit import marian` against `transformers` itself: tiny random Hugging Face Marian models built locally, their
token ids, logits, greedy outputs and scores compared with the library's own."""

from __future__ import annotations

import pytest
import torch
from marian_builder import Variant, build_marian, marian_tokenizer

from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from mtkit.decoding.engine import output_cap
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.importers.marian import import_marian, read_marian

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

SOURCES = [
    "A man in a blue shirt rides a bike in the park.",
    ">>xx<< Two dogs play with the ball on the grass.",
    "the the the",
    "Children!",
]
TARGETS = ["Un homme fait du vélo.", "Deux chiens jouent dans l'herbe.", "le le", "Des enfants !"]
VARIANTS = {
    "swish-safetensors-fp32": Variant(),
    "relu-bin-fp32": Variant(activation="relu", safetensors=False),
    "swish-safetensors-fp16": Variant(fp16=True),
    "separate-vocabularies": Variant(separate=True, safetensors=False),
    "eos-not-0": Variant(eos_first=False, activation="gelu"),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def imported(request, tmp_path_factory: pytest.TempPathFactory):
    """(Hugging Face model as saved, its tokenizer, mtkit's import of the folder, the run directory)."""
    folder = tmp_path_factory.mktemp("marian") / request.param
    build_marian(folder, VARIANTS[request.param], seed=len(request.param))
    from transformers import MarianMTModel

    reference = MarianMTModel.from_pretrained(folder, dtype=torch.float32).eval()  # what the files hold
    run = folder.parent / f"{request.param}-run"
    import_marian(str(folder), run)
    return reference, marian_tokenizer(folder), read_marian(folder), run


def _mtkit_ids(marian_ids: list[int], order: list[int]) -> list[int]:
    inverse = {marian: index for index, marian in enumerate(order)}  # the decoder start maps to BOS, not PAD
    return [inverse[i] for i in marian_ids]


def test_token_ids_equal_marian_tokenizers_after_the_id_mapping(imported) -> None:
    _, tokenizer, marian, _ = imported
    for text in SOURCES:
        expected = _mtkit_ids(tokenizer(text)["input_ids"], marian.source.order)
        assert marian.tokenizers.src.encode(text) + [EOS_ID] == expected
    for text in TARGETS:
        expected = _mtkit_ids(tokenizer(text_target=text)["input_ids"], marian.target.order)
        assert marian.tokenizers.tgt.encode(text) + [EOS_ID] == expected
    language = marian.tokenizers.src.encode(SOURCES[1])[0]
    assert marian.tokenizers.src.id_to_piece([language]) == [">>xx<<"]
    assert 1 in marian.tokenizers.src.encode("the the")  # "▁the" is not in vocab.json: <unk>, as in Marian


def test_teacher_forced_logits_agree_within_1e_5(imported) -> None:
    reference, tokenizer, marian, run = imported
    model = Translator.load(run).engine.model
    batch = tokenizer(SOURCES, text_target=TARGETS, return_tensors="pt", padding=True)
    # MarianTokenizer pads targets with the source vocabulary's pad id: the model's pad instead
    padding = batch["labels"].eq(-100) | batch["labels"].eq(tokenizer.pad_token_id)
    labels = batch["labels"].masked_fill(padding, reference.config.pad_token_id)
    start = torch.full((labels.size(0), 1), reference.config.decoder_start_token_id)
    decoder_input = torch.cat([start, labels[:, :-1]], dim=1)
    with torch.no_grad():
        expected = reference(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input
        ).logits
        src = _padded(batch["input_ids"], batch["attention_mask"], marian.source.order)
        tgt = _padded(decoder_input, torch.ones_like(decoder_input, dtype=torch.bool), marian.target.order)
        tgt[:, 0] = BOS_ID
        found = model(src, src.ne(PAD_ID), tgt)
    columns = [index for index in range(len(marian.target.order)) if index != BOS_ID]
    marian_columns = [marian.target.order[index] for index in columns]
    assert found.shape[-1] == len(marian.target.order)
    torch.testing.assert_close(found[..., columns], expected[..., marian_columns], rtol=0, atol=1e-5)


def _padded(ids: torch.Tensor, mask: torch.Tensor, order: list[int]) -> torch.Tensor:
    inverse = {marian: index for index, marian in enumerate(order)}
    return torch.tensor(
        [
            [inverse[i] if keep else PAD_ID for i, keep in zip(row, keeps, strict=True)]
            for row, keeps in zip(ids.tolist(), mask.tolist(), strict=True)
        ]
    )


def test_greedy_output_is_marian_generate_with_one_beam(imported) -> None:
    reference, tokenizer, marian, run = imported
    translator = Translator.load(run)
    found = translator.translate_nbest(SOURCES, Decoding(beam=1))
    pad = reference.config.pad_token_id
    for text, (best,) in zip(SOURCES, found, strict=True):
        inputs = tokenizer(text, return_tensors="pt")
        cap = output_cap(inputs["input_ids"].size(1), translator.decode, max_positions=10**6)
        generated = reference.generate(
            **inputs, num_beams=1, do_sample=False, max_new_tokens=cap + 1, bad_words_ids=[[pad]], forced_eos_token_id=None
        )[0, 1:].tolist()
        expected = _mtkit_ids(generated, marian.target.order)[:cap]
        assert best.tokens == [token for token in expected if token != EOS_ID][:cap]


def test_score_equals_marian_log_probability_within_1e_4(imported) -> None:
    reference, tokenizer, _, run = imported
    scores = Translator.load(run).score(SOURCES, TARGETS)
    for text, target, score in zip(SOURCES, TARGETS, scores, strict=True):
        batch = tokenizer(text, text_target=target, return_tensors="pt")
        with torch.no_grad():
            logits = reference(input_ids=batch["input_ids"], labels=batch["labels"]).logits
        expected = torch.log_softmax(logits[0], dim=-1).gather(1, batch["labels"][0].unsqueeze(1)).sum().item()
        assert score.tokens == batch["labels"].size(1)
        assert score.log_prob == pytest.approx(expected, abs=1e-4)


def test_search_never_emits_pad_or_bos(imported) -> None:
    _, _, _, run = imported
    translator = Translator.load(run)
    for decoding in (Decoding(beam=1), Decoding(beam=4, nbest=4)):
        for translations in translator.translate_nbest(SOURCES, decoding):
            assert all(PAD_ID not in t.tokens and BOS_ID not in t.tokens for t in translations)
