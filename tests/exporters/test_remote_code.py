"""The remote-code copy of mtkit's layers (mtkit/exporters/remote_code/modeling_mtkit.py: an export carries it, and it
imports only torch and transformers) stays equal to what it copies. Each copied class or function is marked
`# Copied from mtkit.<module>.<name>` on the line above it; here every mark is read from the file, both objects are
built alike with random weights (the original's state dict loads into the copy, strictly), fed the same inputs in
every variant the copy supports, and must give the original's outputs. The end-to-end checks of the exported model
are in tests/integration/exporters/test_remote_code.py."""

from __future__ import annotations

import ast
import importlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers import source_tree
from torch import Tensor, nn

REMOTE_CODE = Path(__file__).resolve().parents[2] / "mtkit" / "exporters" / "remote_code"
MODELING = REMOTE_CODE / "modeling_mtkit.py"
MARK = "# Copied from "
# The classes with no counterpart in mtkit: transformers' model around the layers, and generate's encoder callable.
GLUE = {"MtkitEncoder", "MtkitPreTrainedModel", "MtkitForConditionalGeneration"}
# Equal bit for bit where this was written; a few ulps are left for other kernels (the copy passes a causal flag
# where mtkit writes the causal mask out).
TOLERANCE = 1e-6

VOCAB, D_MODEL, HEADS, FFN_DIM, MAX_POSITIONS, PAD, DROPOUT = 11, 8, 2, 16, 16, 0, 0.1
_INPUTS = torch.Generator().manual_seed(0)
X = torch.randn(2, 5, D_MODEL, generator=_INPUTS)  # (B, T, D)
MEMORY = torch.randn(2, 7, D_MODEL, generator=_INPUTS)  # (B, S, D)
HEADS_QKV = torch.randn(3, 2, HEADS, 5, D_MODEL // HEADS, generator=_INPUTS)  # query, key, value (B, H, T, Dh)
TOKENS = torch.tensor([[4, 5, 6, 7, 3], [4, 9, 3, PAD, PAD]])  # (B, T)
KEY_MASK = TOKENS.ne(PAD)[:, None, None, :]  # (B, 1, 1, T), True on real tokens
MEMORY_MASK = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, None, :]  # (B, 1, 1, S)
SPANS = ((5, 0), (1, 5), (4, 12))  # (length, offset): a sentence, one decoding step, a span up to the table's end
GROWING = (*SPANS, (4, 30))  # and one past it: the sinusoidal table grows
STEPS = ((0, 2), (2, 4), (4, 5))  # target positions fed at a time: a prefix, two new beside a cache, then one


@pytest.fixture(scope="module")
def remote(transformers_installed: None) -> ModuleType:
    """The copy, imported as a module of mtkit's package (an export imports it from its folder alike)."""
    return importlib.import_module("mtkit.exporters.remote_code.modeling_mtkit")


def marks() -> dict[str, str]:
    """{class or function of modeling_mtkit.py: the dotted name of the mtkit object its mark says it copies}."""
    lines = MODELING.read_text(encoding="utf-8").splitlines()
    defined = {
        min([node.lineno] + [decorator.lineno for decorator in node.decorator_list]): node.name
        for node in source_tree(MODELING).body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef))
    }
    found = {}
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith(MARK):
            assert number + 1 in defined, f"modeling_mtkit.py:{number}: {line.strip()!r} is not right above a class or function"
            found[defined[number + 1]] = line.strip().removeprefix(MARK)
    return found


def resolve(dotted: str) -> object | None:
    """The mtkit object `mtkit.<module>.<name>` names; None where there is none."""
    module, _, name = dotted.rpartition(".")
    if module.split(".")[0] != "mtkit":
        return None
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def choices(key: str) -> tuple[str, ...]:
    """The values of a config key the copy supports, as its configuration declares them."""
    return importlib.import_module("mtkit.exporters.remote_code.configuration_mtkit").CHOICES[key]


def config(remote: ModuleType, **keys: object) -> object:
    """The copy's MtkitConfig at the tiny sizes (the copied layers that read a config take it)."""
    sizes = {"d_model": D_MODEL, "heads": HEADS, "ffn_dim": FFN_DIM, "max_positions": MAX_POSITIONS}
    return remote.MtkitConfig(
        src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, dropout=DROPOUT, attention_dropout=DROPOUT, **sizes, **keys
    )


# How to build each pair and call it on the same inputs


@dataclass(frozen=True)
class Case:
    """One variant: the original and the copy built alike, how the original is called, and the copy (if not alike)."""

    variant: str
    original: nn.Module
    copy: nn.Module
    run_original: Callable[[nn.Module], Tensor]
    run_copy: Callable[[nn.Module], Tensor] | None = None


def positions(spans: tuple[tuple[int, int], ...]) -> tuple[Callable, Callable]:
    """The rows of `spans` from mtkit's positions (length, offset) and from the copy's (length, offset, like)."""
    return (
        lambda layer: torch.cat([layer(length, offset) for length, offset in spans]),
        lambda layer: torch.cat([layer(length, offset, X) for length, offset in spans]),
    )


def stepped(call: Callable[[Tensor], Tensor | tuple]) -> Tensor:
    """X fed a few positions at a time (STEPS), as incremental decoding feeds it; the outputs joined (B, T, D)."""
    outputs = [call(X[:, start:end]) for start, end in STEPS]
    return torch.cat([output[0] if isinstance(output, tuple) else output for output in outputs], dim=1)


def self_attention_steps(layer: nn.Module) -> Tensor:
    state = {}  # mtkit's decoder state: one dict
    return stepped(lambda x: layer(x, cache=state))


def copy_self_attention_steps(layer: nn.Module) -> Tensor:
    cache = importlib.import_module("transformers.cache_utils").DynamicCache()
    return stepped(lambda x: layer(x, cache=cache))


def decoder_steps(layer: nn.Module) -> Tensor:
    state = {}
    return stepped(lambda x: layer(x, MEMORY, MEMORY_MASK, state, ""))


def copy_decoder_steps(layer: nn.Module) -> Tensor:
    cache_utils = importlib.import_module("transformers.cache_utils")
    cache = cache_utils.EncoderDecoderCache(cache_utils.DynamicCache(), cache_utils.DynamicCache())  # as generate keeps it
    return stepped(lambda x: layer(x, MEMORY, MEMORY_MASK, cache))


def embedding_cases(original: type, copy: type, remote: ModuleType) -> Iterator[Case]:
    yield Case("scaled", original(VOCAB, D_MODEL, pad_id=PAD), copy(VOCAB, D_MODEL, pad_id=PAD), lambda layer: layer(TOKENS))


def sinusoidal_cases(original: type, copy: type, remote: ModuleType) -> Iterator[Case]:
    for halves in (False, True):
        pair = original(D_MODEL, MAX_POSITIONS, halves=halves), copy(D_MODEL, MAX_POSITIONS, halves=halves)
        yield Case(f"halves={halves}", *pair, *positions(GROWING))


def learned_cases(original: type, copy: type, remote: ModuleType) -> Iterator[Case]:
    yield Case("learned", original(D_MODEL, MAX_POSITIONS), copy(D_MODEL, MAX_POSITIONS), *positions(SPANS))


def make_positions_cases(original: Callable, copy: Callable, remote: ModuleType) -> Iterator[Case]:
    for kind in choices("positions"):
        pair = original(kind, D_MODEL, max_positions=MAX_POSITIONS), copy(config(remote, positions=kind))
        yield Case(f"positions={kind}", *pair, *positions(SPANS))


def attention_cases(original: type, copy: type, remote: ModuleType) -> Iterator[Case]:
    """The base class's fused attention; the output projection is what a subclass adds."""
    for mask, causal in ((None, False), (None, True), (KEY_MASK, False)):
        pair = original(D_MODEL, HEADS, dropout=DROPOUT), copy(D_MODEL, HEADS, dropout=DROPOUT, layer_idx=None)
        for layer in pair:
            layer.out = nn.Linear(D_MODEL, D_MODEL)
        options = {"value": HEADS_QKV[2], "mask": mask, "causal": causal}
        yield Case(
            f"mask={mask is not None}, causal={causal}", *pair, lambda layer, o=options: layer.attend(*HEADS_QKV[:2], **o)
        )


def self_attention_cases(original: type, copy: type, remote: ModuleType) -> Iterator[Case]:
    encoder = original(D_MODEL, HEADS, dropout=DROPOUT, causal=False), copy(D_MODEL, HEADS, dropout=DROPOUT, causal=False)
    yield Case("encoder, padded", *encoder, lambda layer: layer(X, KEY_MASK))
    decoder = (
        original(D_MODEL, HEADS, dropout=DROPOUT, causal=True),
        copy(D_MODEL, HEADS, dropout=DROPOUT, causal=True, layer_idx=0),
    )
    yield Case("decoder", *decoder, lambda layer: layer(X))
    yield Case("decoder, incremental", *decoder, self_attention_steps, copy_self_attention_steps)


def cross_attention_cases(original: type, copy: type, remote: ModuleType) -> Iterator[Case]:
    pair = original(D_MODEL, HEADS, dropout=DROPOUT), copy(D_MODEL, HEADS, dropout=DROPOUT, layer_idx=0)
    yield Case("whole", *pair, lambda layer: layer(X, MEMORY, MEMORY_MASK)[0], lambda layer: layer(X, MEMORY, MEMORY_MASK, None))
    yield Case("incremental", *pair, decoder_steps, copy_decoder_steps)


def feed_forward_cases(original: type, copy: type, remote: ModuleType) -> Iterator[Case]:
    for activation in choices("activation"):
        pair = (
            original(D_MODEL, FFN_DIM, dropout=DROPOUT, activation=activation),
            copy(D_MODEL, FFN_DIM, dropout=DROPOUT, activation=activation),
        )
        yield Case(f"activation={activation}", *pair, lambda layer: layer(X))


def residual_cases(original: type, copy: type, remote: ModuleType) -> Iterator[Case]:
    for norm in choices("norm"):
        pair = original(D_MODEL, DROPOUT, pre_norm=norm == "pre"), copy(D_MODEL, DROPOUT, pre_norm=norm == "pre")
        yield Case(f"norm={norm}", *pair, lambda layer: layer(X, torch.tanh))


def layer_arguments(norm: str, activation: str) -> dict[str, object]:
    """mtkit's EncoderLayer's and DecoderLayer's options at the tiny sizes (after D_MODEL and HEADS)."""
    return {
        "ffn_dim": FFN_DIM,
        "dropout": DROPOUT,
        "attention_dropout": DROPOUT,
        "pre_norm": norm == "pre",
        "activation": activation,
    }


def encoder_layer_cases(original: type, copy: type, remote: ModuleType) -> Iterator[Case]:
    for norm, activation in itertools.product(choices("norm"), choices("activation")):
        pair = (
            original(D_MODEL, HEADS, **layer_arguments(norm, activation)),
            copy(config(remote, norm=norm, activation=activation)),
        )
        yield Case(f"norm={norm}, activation={activation}", *pair, lambda layer: layer(X, KEY_MASK))


def decoder_layer_cases(original: type, copy: type, remote: ModuleType) -> Iterator[Case]:
    for norm, activation in itertools.product(choices("norm"), choices("activation")):
        pair = (
            original(D_MODEL, HEADS, **layer_arguments(norm, activation)),
            copy(config(remote, norm=norm, activation=activation), 0),
        )
        variant = f"norm={norm}, activation={activation}"
        yield Case(
            variant,
            *pair,
            lambda layer: layer(X, MEMORY, MEMORY_MASK, None, "")[0],
            lambda layer: layer(X, MEMORY, MEMORY_MASK, None),
        )
        yield Case(f"{variant}, incremental", *pair, decoder_steps, copy_decoder_steps)


# {marked name in modeling_mtkit.py: the variants of it and its original}
CASES: dict[str, Callable[[object, object, ModuleType], Iterator[Case]]] = {
    "MtkitEmbedding": embedding_cases,
    "MtkitSinusoidalPositions": sinusoidal_cases,
    "MtkitLearnedPositions": learned_cases,
    "make_positions": make_positions_cases,
    "MtkitAttention": attention_cases,
    "MtkitSelfAttention": self_attention_cases,
    "MtkitCrossAttention": cross_attention_cases,
    "MtkitFeedForward": feed_forward_cases,
    "MtkitResidual": residual_cases,
    "MtkitEncoderLayer": encoder_layer_cases,
    "MtkitDecoderLayer": decoder_layer_cases,
}


def randomized(module: nn.Module) -> nn.Module:
    """Every parameter drawn at random (LayerNorms and biases too, so that none is the identity)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(generator=generator)
    return module


# The tests


def test_every_mark_names_an_object_of_mtkit() -> None:
    unresolved = [f"{name}: {dotted}" for name, dotted in marks().items() if resolve(dotted) is None]
    assert not unresolved, f"modeling_mtkit.py marks copies of objects mtkit does not have: {unresolved}"


def test_every_class_is_marked_as_a_copy_or_listed_as_glue() -> None:
    classes = {node.name for node in source_tree(MODELING).body if isinstance(node, ast.ClassDef)}
    unmarked = sorted(classes - marks().keys() - GLUE)
    assert not unmarked, f"mark these `{MARK}mtkit.<module>.<name>` or list them in GLUE: {unmarked}"
    assert GLUE <= classes - marks().keys(), f"GLUE names classes modeling_mtkit.py lacks or marks: {GLUE}"


def test_every_mark_has_its_variants_in_the_table() -> None:
    assert marks().keys() == CASES.keys(), "each marked copy needs its row in CASES, and each row its mark"


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_copy_gives_its_originals_outputs(name: str, remote: ModuleType) -> None:
    original, copy = resolve(marks()[name]), getattr(remote, name)
    for case in CASES[name](original, copy, remote):
        with torch.no_grad():
            case.copy.load_state_dict(randomized(case.original).state_dict())  # strict: the same parameter names
            expected = case.run_original(case.original.eval())
            found = (case.run_copy or case.run_original)(case.copy.eval())
        torch.testing.assert_close(
            found, expected, rtol=TOLERANCE, atol=TOLERANCE, msg=lambda text, case=case: f"{name} ({case.variant}): {text}"
        )
