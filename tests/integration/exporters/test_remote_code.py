"""The modeling code a `transformers` export ships (mtkit/exporters/remote_code), loaded as the Hub loads it
(`trust_remote_code=True` from a folder holding its files), against tiny random mtkit Transformers: the same
parameter names, the same log-probabilities, the same greedy translations, incremental generation."""

from __future__ import annotations

import importlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import Tensor

from mtkit.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from mtkit.models.transformer import Transformer

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytestmark = pytest.mark.usefixtures("hf_modules_cache")  # shared_fixtures.py

REMOTE_CODE = Path(__file__).resolve().parents[3] / "mtkit" / "exporters" / "remote_code"
VOCAB, TARGET_VOCAB, MAX_NEW_TOKENS = 40, 37, 10
SOURCES = torch.tensor([[5, 6, 7, 8, 9, EOS_ID], [10, 11, EOS_ID, PAD_ID, PAD_ID, PAD_ID], [12, 13, 14, EOS_ID, PAD_ID, PAD_ID]])
DECODER_INPUTS = torch.tensor([[BOS_ID, 4, 5, 6, 7], [BOS_ID, 8, 9, EOS_ID, PAD_ID], [BOS_ID, 30, 31, 32, 33]])


@dataclass(frozen=True)
class Variant:
    norm: str = "pre"
    positions: str = "sinusoidal"
    activation: str = "relu"
    output_bias: bool = False
    tie_embeddings: bool = True
    joint_vocab: bool = True  # one vocabulary of VOCAB pieces; else the target has TARGET_VOCAB of its own


VARIANTS = {
    "pre-sinusoidal-shared": Variant(),
    "pre-halves-gelu-bias-tied": Variant(positions="sinusoidal_halves", activation="gelu", output_bias=True, joint_vocab=False),
    "pre-learned-swish-untied": Variant(positions="learned", activation="swish", tie_embeddings=False, joint_vocab=False),
    "post-sinusoidal-swish-bias-untied-joint": Variant(norm="post", activation="swish", output_bias=True, tie_embeddings=False),
    "post-halves-relu-bias-shared": Variant(norm="post", positions="sinusoidal_halves", output_bias=True),
    "post-learned-gelu-tied": Variant(norm="post", positions="learned", activation="gelu", joint_vocab=False),
}


def random_transformer(variant: Variant, seed: int) -> Transformer:
    """A tiny mtkit Transformer with every parameter (norms and biases too) drawn at random, so no wrong mapping hides."""
    torch.manual_seed(seed)
    model = Transformer(
        VOCAB,
        VOCAB if variant.joint_vocab else TARGET_VOCAB,
        d_model=16,
        heads=2,
        ffn_dim=32,
        dropout=0.1,
        attention_dropout=0.1,
        norm=variant.norm,
        positions=variant.positions,
        tie_embeddings=variant.tie_embeddings,
        share_vocab=variant.joint_vocab,
        max_positions=32,
        activation=variant.activation,
        encoder_layers=2,
        decoder_layers=1,
        output_bias=variant.output_bias,
    )
    for parameter in model.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    return model.eval()


def remote_config(model: Transformer, variant: Variant) -> dict:
    """config.json as `mtkit export` writes it for the remote-code form."""
    return {
        "architectures": ["MtkitForConditionalGeneration"],
        "model_type": "mtkit-transformer",
        "auto_map": {
            "AutoConfig": "configuration_mtkit.MtkitConfig",
            "AutoModelForSeq2SeqLM": "modeling_mtkit.MtkitForConditionalGeneration",
        },
        "src_vocab_size": model.src_embed.embedding.num_embeddings,
        "tgt_vocab_size": model.output.out_features,
        "vocab_size": model.output.out_features,
        "d_model": 16,
        "heads": 2,
        "ffn_dim": 32,
        "encoder_layers": 2,
        "decoder_layers": 1,
        "norm": variant.norm,
        "positions": variant.positions,
        "max_positions": 32,
        "activation": variant.activation,
        "tie_embeddings": variant.tie_embeddings,
        "share_embeddings": model.src_embed is model.tgt_embed,
        "output_bias": variant.output_bias,
        "dropout": 0.1,
        "attention_dropout": 0.1,
        "is_encoder_decoder": True,
        **{"pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "bos_token_id": BOS_ID, "decoder_start_token_id": BOS_ID},
    }


def tied_copies(model: Transformer) -> set[str]:
    """The state-dict entries that are another entry's tensor: stored once."""
    tied = {"output.weight"} if model.output.weight is model.tgt_embed.weight else set()
    return tied | ({"tgt_embed.embedding.weight"} if model.src_embed is model.tgt_embed else set())


def export(model: Transformer, variant: Variant, folder: Path) -> None:
    """The folder `mtkit export` writes for the remote-code form: both modeling files, config.json with its
    auto_map, and mtkit's own tensors under mtkit's names, each tied tensor once."""
    folder.mkdir(parents=True)
    for path in REMOTE_CODE.glob("*_mtkit.py"):
        shutil.copyfile(path, folder / path.name)
    (folder / "config.json").write_text(json.dumps(remote_config(model, variant)), encoding="utf-8")
    tensors = {name: tensor.contiguous() for name, tensor in model.state_dict().items() if name not in tied_copies(model)}
    safetensors_torch.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def load(folder: Path) -> tuple[torch.nn.Module, dict]:
    """The model as `AutoModelForSeq2SeqLM` loads the folder (in eval mode), and its loading problems (missing,
    unexpected or mismatched keys) if any."""
    model, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
    return model.eval(), {key: value for key, value in info.items() if value}


@dataclass
class Exported:
    variant: Variant
    mtkit: Transformer
    folder: Path
    model: torch.nn.Module  # transformers' model loaded from the folder
    loading_problems: dict


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    variant = VARIANTS[request.param]
    mtkit_model = random_transformer(variant, seed=list(VARIANTS).index(request.param))
    folder = tmp_path_factory.mktemp("export") / request.param
    export(mtkit_model, variant, folder)
    return Exported(variant, mtkit_model, folder, *load(folder))


def mtkit_log_probs(model: Transformer, src: Tensor, tgt: Tensor) -> Tensor:
    src_mask = src.ne(PAD_ID)
    logits, _ = model.decode(tgt, model.encode(src, src_mask), src_mask=src_mask)
    return torch.log_softmax(logits, dim=-1)


def mtkit_greedy(model: Transformer, src: Tensor, steps: int) -> list[list[int]]:
    """Greedy decoding with mtkit's model, one teacher-forced decode per step: BOS, then the argmax, up to EOS."""
    tokens = torch.full((src.size(0), 1), BOS_ID)
    for _ in range(steps):
        best = mtkit_log_probs(model, src, tokens)[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, best], dim=1)
    return [until_eos(row) for row in tokens.tolist()]


def until_eos(row: list[int]) -> list[int]:
    return row[: row.index(EOS_ID, 1) + 1] if EOS_ID in row[1:] else row


def generate(model: torch.nn.Module, **options) -> Tensor:
    with torch.no_grad():
        return model.generate(SOURCES, attention_mask=SOURCES.ne(PAD_ID), max_new_tokens=MAX_NEW_TOKENS, **options)


def test_the_folder_loads_under_mtkits_names_with_nothing_missing(exported: Exported) -> None:
    model, mtkit_model = exported.model, exported.mtkit
    assert type(model).__module__.startswith("transformers_modules.")  # the folder's copy, not mtkit's package
    assert exported.loading_problems == {}
    assert list(model.state_dict()) == list(mtkit_model.state_dict())
    assert (model.output.weight is model.tgt_embed.embedding.weight) == exported.variant.tie_embeddings
    assert (model.tgt_embed is model.src_embed) == ("tgt_embed.embedding.weight" in tied_copies(mtkit_model))
    model.load_state_dict(mtkit_model.state_dict())  # strict: every name is mtkit's


def test_save_pretrained_and_from_pretrained_keep_the_model(exported: Exported, tmp_path: Path) -> None:
    exported.model.save_pretrained(tmp_path)  # with the modeling files: the class came from a folder
    reloaded, problems = load(tmp_path)
    assert problems == {}
    with torch.no_grad():
        logits = [model(input_ids=SOURCES, decoder_input_ids=DECODER_INPUTS).logits for model in (exported.model, reloaded)]
    assert torch.equal(*logits)


@pytest.mark.parametrize("use_cache", [False, True])
def test_teacher_forced_log_probabilities_equal_mtkits(exported: Exported, use_cache: bool) -> None:
    with torch.no_grad():
        expected = mtkit_log_probs(exported.mtkit, SOURCES, DECODER_INPUTS)
        output = exported.model(
            input_ids=SOURCES, attention_mask=SOURCES.ne(PAD_ID).long(), decoder_input_ids=DECODER_INPUTS, use_cache=use_cache
        )
    assert output.logits.shape == (3, DECODER_INPUTS.size(1), exported.mtkit.output.out_features)
    torch.testing.assert_close(torch.log_softmax(output.logits, dim=-1), expected, rtol=0.0, atol=1e-5)


def test_decoding_piece_by_piece_with_a_cache_equals_teacher_forcing(exported: Exported) -> None:
    """Positions go on after the cached tokens, and new tokens see the cached ones (one or two at a time)."""
    cache_utils = importlib.import_module("transformers.cache_utils")
    cache = cache_utils.EncoderDecoderCache(cache_utils.DynamicCache(), cache_utils.DynamicCache())
    model, mask = exported.model, SOURCES.ne(PAD_ID).long()
    with torch.no_grad():
        encoded = model.get_encoder()(SOURCES, mask)
        pieces = [
            model(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=DECODER_INPUTS[:, part], cache=cache).logits
            for part in (slice(0, 1), slice(1, 3), slice(3, 4), slice(4, 5))
        ]
    found = torch.log_softmax(torch.cat(pieces, dim=1), dim=-1)
    expected = mtkit_log_probs(exported.mtkit, SOURCES, DECODER_INPUTS)
    torch.testing.assert_close(found, expected, rtol=0.0, atol=1e-5)


def test_greedy_generate_equals_mtkits_greedy_decoding(exported: Exported) -> None:
    generated = generate(exported.model, num_beams=1, do_sample=False)
    assert [until_eos(row) for row in generated.tolist()] == mtkit_greedy(exported.mtkit, SOURCES, MAX_NEW_TOKENS)
    for row in generated.tolist():  # after EOS, transformers pads
        assert set(row[len(until_eos(row)) :]) <= {PAD_ID}


@pytest.mark.parametrize("beams", [1, 4])
def test_cached_and_uncached_generation_agree(exported: Exported, beams: int) -> None:
    cached = generate(exported.model, num_beams=beams, do_sample=False, use_cache=True)
    assert cached.size(0) == SOURCES.size(0)
    assert cached[:, 0].tolist() == [BOS_ID] * SOURCES.size(0)  # the decoder starts from BOS
    assert torch.equal(cached, generate(exported.model, num_beams=beams, do_sample=False, use_cache=False))


def test_generation_is_incremental(exported: Exported) -> None:
    """With the cache each step runs the decoder on its new token alone, and the source is encoded once."""
    widths: dict[str, list[int]] = {"encoder": [], "decoder": []}
    hooks = [
        getattr(exported.model, f"{stack}_layers")[0].register_forward_pre_hook(
            lambda _, inputs, stack=stack: widths[stack].append(inputs[0].size(1))  # x (B, T, D)
        )
        for stack in widths
    ]
    try:
        generated = generate(exported.model, num_beams=2, do_sample=False)
    finally:
        for hook in hooks:
            hook.remove()
    assert widths == {"encoder": [SOURCES.size(1)], "decoder": [1] * (generated.size(1) - 1)}


@pytest.fixture(scope="module")
def with_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """The default variant's folder with a tokenizer of its own: pieces w4 .. w39 at ids 4 .. 39, EOS after a text."""
    tokenizers = pytest.importorskip("tokenizers")
    variant = Variant()
    mtkit_model = random_transformer(variant, seed=7)
    folder = tmp_path_factory.mktemp("export") / "with-tokenizer"
    export(mtkit_model, variant, folder)
    pieces = {"<pad>": PAD_ID, "<unk>": 1, "<s>": BOS_ID, "</s>": EOS_ID} | {f"w{i}": i for i in range(4, VOCAB)}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(pieces, unk_token="<unk>"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    words.post_processor = tokenizers.processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS_ID)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_input_names=["input_ids", "attention_mask"],  # as MarianTokenizer's
    )
    tokenizer.save_pretrained(folder)
    return Exported(variant, mtkit_model, folder, *load(folder))


TEXTS = ["w5 w6 w7 w8 w9", "w10 w11"]


def translate(folder: Path, model: torch.nn.Module) -> list[str]:
    """What a pipeline does: the folder's tokenizer, generate, decode."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)  # it reads config.json too
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    assert batch["input_ids"][0].tolist() == [5, 6, 7, 8, 9, EOS_ID]  # ids + EOS, as mtkit reads a source
    with torch.no_grad():
        generated = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, num_beams=1)
    return tokenizer.batch_decode(generated, skip_special_tokens=True)


def test_the_folders_tokenizer_and_generate_translate_as_mtkit(with_tokenizer: Exported) -> None:
    sources = torch.tensor([[5, 6, 7, 8, 9, EOS_ID], [10, 11, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])  # TEXTS
    mtkit_ids = mtkit_greedy(with_tokenizer.mtkit, sources, MAX_NEW_TOKENS)
    mtkit_texts = [" ".join(f"w{i}" for i in ids if i > EOS_ID) for ids in mtkit_ids]
    assert translate(with_tokenizer.folder, with_tokenizer.model) == mtkit_texts


def test_a_translation_pipeline_translates(with_tokenizer: Exported) -> None:
    if "translation" not in transformers.pipelines.SUPPORTED_TASKS:
        pytest.skip(f"transformers {transformers.__version__} has no translation pipeline (transformers 5 removed it)")
    translator = transformers.pipeline("translation", model=str(with_tokenizer.folder), trust_remote_code=True)
    found = translator(TEXTS, max_new_tokens=MAX_NEW_TOKENS, num_beams=1)
    assert [item["translation_text"] for item in found] == translate(with_tokenizer.folder, with_tokenizer.model)
