"""The pure rules of fine-tuning a model with language codes: a corpus's code named as --tgt-lang names it (errors
naming the recipe key), `data.new_languages` read and checked, the rows a new code starts from, and the one </s>
row that mtkit's BOS and EOS rows hold (`train_as_family`)."""

from __future__ import annotations

import pytest
import torch

from mtkit.config import LoraConfig, config_from_dict
from mtkit.data.language_codes import MEAN, added_code_pieces, code_piece, new_languages, recipe_code_id, start_rows
from mtkit.data.tokenizer import BOS_ID, EOS_ID
from mtkit.errors import MtkitError
from mtkit.models.lora import apply_lora
from mtkit.models.transformer import Transformer
from mtkit.training.finetune import train_as_family

NLLB = {"deu_Latn": 6, "eng_Latn": 7, "fra_Latn": 8}
NLLB_TABLE = ["<pad>", "<unk>", "<s>", "</s>", "<s>", "▁a", *NLLB]
M2M100 = {"de": 6, "en": 7}
M2M100_TABLE = ["<pad>", "<unk>", "<s>", "</s>", "<s>", "▁a", "__de__", "__en__"]


def test_a_corpus_code_is_named_as_the_flags_name_it_and_its_error_names_the_key() -> None:
    assert recipe_code_id(NLLB, "fr", key="data.train.tgt_lang") == 8
    assert recipe_code_id(NLLB, "deu_Latn", key="src_lang") == 6
    with pytest.raises(MtkitError) as raised:
        recipe_code_id(NLLB, "fro_Latn", key="data.train[1].tgt_lang")
    message = str(raised.value)
    assert message.startswith("data.train[1].tgt_lang fro_Latn: the model has no such language code; the closest it has: ")
    assert "--" not in message and "\n" not in message


def test_new_languages_are_read_as_new_code_to_the_code_it_starts_from() -> None:
    assert new_languages("xyz_Latn=fra_Latn, abc_Latn = mean") == {"xyz_Latn": "fra_Latn", "abc_Latn": MEAN}
    assert new_languages("") == {}
    assert config_from_dict({"data": {"new_languages": "xyz_Latn=fra_Latn"}}).data.new_languages == "xyz_Latn=fra_Latn"
    with pytest.raises(MtkitError, match="data.new_languages"):
        config_from_dict({"data": {"new_languages": "xyz_Latn"}})  # no code to start from


def test_a_new_code_takes_the_form_of_the_models_codes() -> None:
    assert code_piece("xyz_Latn", NLLB, pieces=NLLB_TABLE) == "xyz_Latn"
    assert code_piece("xx", M2M100, pieces=M2M100_TABLE) == "__xx__"
    assert added_code_pieces({"xyz_Latn": "fr", "abc_Latn": MEAN}, NLLB, pieces=NLLB_TABLE) == ["xyz_Latn", "abc_Latn"]
    assert added_code_pieces({"xx": "de"}, M2M100, pieces=M2M100_TABLE) == ["__xx__"]


@pytest.mark.parametrize(
    ("new", "message"),
    [
        ({"fra_Latn": "deu_Latn"}, "data.new_languages fra_Latn: the model has this language code already"),
        ({"xyz": "deu_Latn"}, "data.new_languages xyz: not a language code of the model's form; .* such as deu_Latn"),
        ({"xyz_Latn": "qqq_Zzzz"}, "data.new_languages qqq_Zzzz: the model has no such language code; the closest"),
    ],
)
def test_bad_new_codes_are_one_line(new: dict[str, str], message: str) -> None:
    with pytest.raises(MtkitError, match=message) as raised:
        added_code_pieces(new, NLLB, pieces=NLLB_TABLE)
    assert "\n" not in str(raised.value)


def test_a_new_code_starts_from_its_named_codes_row_or_every_codes() -> None:
    assert start_rows({"xyz_Latn": "fr", "abc_Latn": MEAN}, NLLB, pieces=NLLB_TABLE) == {"xyz_Latn": [8], "abc_Latn": [6, 7, 8]}
    assert start_rows({"xx": "en"}, M2M100, pieces=M2M100_TABLE) == {"__xx__": [7]}


def _tiny(lang_tag: str) -> tuple[Transformer, object]:
    config = config_from_dict({"data": {"lang_tag": lang_tag}})
    torch.manual_seed(0)
    model = Transformer(12, 12, d_model=8, heads=2, ffn_dim=16, layers=1, dropout=0.0, output_bias=True)
    with torch.no_grad():
        model.src_embed.embedding.weight[BOS_ID] = model.src_embed.embedding.weight[EOS_ID]
    return model, config


def _gradient(lang_tag: str) -> tuple[Transformer, torch.Tensor]:
    """A tiny model's embedding gradient of one pair, trained as `train_as_family` says for `lang_tag`."""
    model, config = _tiny(lang_tag)
    train_as_family(model, config)
    src, tgt_in, tgt_out = torch.tensor([[5, 6, EOS_ID]]), torch.tensor([[BOS_ID, 7, 8]]), torch.tensor([[7, 8, EOS_ID]])
    logits = model(src, src.ne(0), tgt_in)
    torch.nn.functional.cross_entropy(logits.reshape(-1, 12), tgt_out.reshape(-1)).backward()
    return model, model.src_embed.embedding.weight.grad


def test_a_model_with_codes_gives_its_bos_and_eos_rows_their_summed_gradient_and_keeps_its_output_bias() -> None:
    """What a shared </s> row receives: equal rows with equal gradients stay equal under Adam's elementwise update."""
    tied_model, tied = _gradient("code")
    plain_model, plain = _gradient("none")
    assert not torch.equal(plain[BOS_ID], plain[EOS_ID])
    assert torch.equal(tied[BOS_ID], tied[EOS_ID])
    assert torch.allclose(tied[BOS_ID], plain[BOS_ID] + plain[EOS_ID])
    assert torch.allclose(tied[5:], plain[5:])
    assert not tied_model.output.bias.requires_grad and plain_model.output.bias.grad is not None


def test_an_adapted_table_keeps_its_bos_and_eos_adapter_rows_one_row() -> None:
    """With train.lora's embedding target, the adapter's rows (lora_A, by id) get the summed gradient too, so the
    merged BOS and EOS rows stay one row for the family's export."""
    rows = []
    for lang_tag in ("code", "none"):
        model, config = _tiny(lang_tag)
        apply_lora(model, LoraConfig(rank=2, targets=["embedding"]))
        train_as_family(model, config)
        src, tgt_in, tgt_out = torch.tensor([[5, 6, EOS_ID]]), torch.tensor([[BOS_ID, 7, 8]]), torch.tensor([[7, 8, EOS_ID]])
        torch.nn.functional.cross_entropy(model(src, src.ne(0), tgt_in).reshape(-1, 12), tgt_out.reshape(-1)).backward()
        rows.append(model.src_embed.embedding.lora_A.grad)
    tied, plain = rows
    assert torch.equal(tied[BOS_ID], tied[EOS_ID]) and not torch.equal(plain[BOS_ID], plain[EOS_ID])
    assert torch.allclose(tied[BOS_ID], plain[BOS_ID] + plain[EOS_ID])
