"""Packing chosen per machine: each weight shape measured once at the first load that asks for the fast paths,
the answer cached in the user's cache folder and read by later loads; MTKIT_FAST_PATHS=packed|plain decides
instead; decoding gives the same tokens either way. The measurement is driven by fake clocks and stand-ins, never
by wall time."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from helpers import small_transformer
from torch import nn

from mtkit.config import ModelConfig
from mtkit.data.tokenizer import load_tokenizers
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.models import build_model
from mtkit.models import fast_paths as fast_paths_module
from mtkit.models import packed as packed_module
from mtkit.models.base import OutputRows
from mtkit.models.checkpoint import checkpoint_payload, save_checkpoint
from mtkit.models.fast_paths import (
    cache_file,
    fastest_in_turns,
    machine_key,
    measure_packing,
    pack_where_faster,
    shape_name,
)
from mtkit.models.packed import PackedLinear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


@pytest.fixture(autouse=True)
def own_cache_and_small_weights(monkeypatch, tmp_path):
    """Each test has a cache folder of its own and the default setting; the tiny test models' linears all count
    as large."""
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MTKIT_FAST_PATHS", raising=False)
    monkeypatch.setattr(packed_module, "SMALLEST", 0)


@pytest.fixture
def measured(monkeypatch) -> list[str]:
    """The shapes `measure_packing` is asked about, in order; packing 'wins' where the weight is wider than tall."""
    asked: list[str] = []

    def stand_in(linear: nn.Linear) -> bool:
        asked.append(shape_name(linear))
        return linear.in_features > linear.out_features

    monkeypatch.setattr(fast_paths_module, "measure_packing", stand_in)
    return asked


def shapes(model: nn.Module) -> set[str]:
    return {shape_name(m) for m in model.modules() if isinstance(m, nn.Linear)}


def packed_shapes(model: nn.Module) -> set[str]:
    return {shape_name(m) for m in model.modules() if isinstance(m, PackedLinear)}


def stored() -> dict:
    return json.loads(cache_file(machine_key()).read_text(encoding="utf-8"))


def test_the_first_load_measures_each_shape_once_and_later_loads_read_the_cache(measured):
    model = small_transformer()
    pack_where_faster(model)
    assert sorted(measured) == sorted(shapes(model))  # each distinct shape once, however many layers share it
    wins = {name: int(name.split("x")[1]) > int(name.split("x")[0]) for name in shapes(model)}
    assert stored() == {"key": machine_key(), "packing_wins": wins}
    assert packed_shapes(model) == {name for name, win in wins.items() if win} != set()
    again = small_transformer()
    assert pack_where_faster(again) == sum(isinstance(m, PackedLinear) for m in model.modules())
    assert len(measured) == len(wins)  # read back: nothing measured
    assert packed_shapes(again) == packed_shapes(model)
    wider = small_transformer(ffn_dim=128)  # two new shapes: only they are measured, and added to the file
    pack_where_faster(wider)
    assert sorted(measured[len(wins) :]) == ["128x32", "32x128"]
    assert stored()["packing_wins"] == wins | {"128x32": False, "32x128": True}


@pytest.mark.parametrize(
    "damage",
    [
        b"\xff\xfe not text",
        b'{"key": {"cpu"',  # cut short
        b"[]",
        b'{"key": "another machine", "packing_wins": {"40x32": true}}',
        b" " * (1 << 17),  # larger than mtkit writes
    ],
)
def test_a_damaged_cache_file_is_measured_again_and_rewritten(measured, damage):
    model = small_transformer()
    path = cache_file(machine_key())
    path.parent.mkdir(parents=True)
    path.write_bytes(damage)
    pack_where_faster(model)
    assert sorted(measured) == sorted(shapes(model))
    assert set(stored()["packing_wins"]) == shapes(model)


def test_answers_of_the_wrong_type_are_measured_again_and_the_others_kept(measured):
    model = small_transformer()
    path = cache_file(machine_key())
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": machine_key(), "packing_wins": {"40x32": "yes", "32x40": True}}))
    pack_where_faster(model)
    assert "40x32" in measured and "32x40" not in measured
    assert stored()["packing_wins"]["40x32"] is False and stored()["packing_wins"]["32x40"] is True


def test_an_unwritable_cache_folder_is_no_error_and_the_next_load_measures_again(measured, tmp_path, monkeypatch):
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv("MTKIT_CACHE_DIR", str(tmp_path / "a file"))
    first, second = small_transformer(), small_transformer()
    pack_where_faster(first)
    pack_where_faster(second)
    assert len(measured) == 2 * len(shapes(first))
    assert packed_shapes(first) == packed_shapes(second) != set()


@pytest.mark.parametrize(
    "change",
    [
        lambda monkeypatch: monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512_AMX"),
        lambda monkeypatch: monkeypatch.setattr(torch, "__version__", "9.9.9"),
        lambda monkeypatch: monkeypatch.setattr(torch, "get_num_threads", lambda: 96),
        lambda monkeypatch: monkeypatch.setattr(fast_paths_module, "cpu_description", lambda: {"model name": "Xeon"}),
    ],
    ids=["capability", "torch", "threads", "cpu"],
)
def test_the_cache_key_changes_with_what_decides_the_outcome_and_a_new_key_is_measured(measured, monkeypatch, change):
    pack_where_faster(small_transformer())
    before_key, before_file = machine_key(), cache_file(machine_key())
    change(monkeypatch)
    assert machine_key() != before_key and cache_file(machine_key()) != before_file
    pack_where_faster(small_transformer())
    assert len(measured) == 2 * len(shapes(small_transformer()))
    assert before_file.exists() and cache_file(machine_key()).exists()  # one file per machine key


@pytest.mark.parametrize("setting", ["packed", "plain"])
def test_mtkit_fast_paths_packed_or_plain_decides_without_measuring(measured, monkeypatch, setting):
    monkeypatch.setenv("MTKIT_FAST_PATHS", setting)
    model = small_transformer()
    count = pack_where_faster(model)
    assert packed_shapes(model) == (shapes(model) if setting == "packed" else set())
    assert count == sum(isinstance(m, PackedLinear) for m in model.modules())
    assert measured == [] and not cache_file(machine_key()).exists()


def fake_costs(monkeypatch, *, plain: float, packed: float) -> SimpleNamespace:
    """A clock that moves only when a product runs: by `plain` for `F.linear` and `packed` for the laid-out one."""
    clock = SimpleNamespace(now=0.0)

    def charged(function, cost):
        def run(*arguments, **options):
            clock.now += cost
            return function(*arguments, **options)

        return run

    monkeypatch.setattr(fast_paths_module, "F", SimpleNamespace(linear=charged(torch.nn.functional.linear, plain)))
    monkeypatch.setattr(fast_paths_module, "packed_product", charged(packed_module.packed_product, packed))
    return clock


@pytest.mark.parametrize(
    ("plain", "packed", "wins"), [(1.0, 0.5, True), (1.0, 0.99, False), (1.0, 1.0, False), (0.5, 1.0, False)]
)
def test_packing_wins_only_when_clearly_faster_by_the_clock(monkeypatch, plain, packed, wins):
    clock = fake_costs(monkeypatch, plain=plain, packed=packed)
    assert measure_packing(nn.Linear(32, 48), clock=lambda: clock.now) is wins


def test_turns_alternate_keep_each_sides_fastest_and_stop_at_the_budget(monkeypatch):
    clock, order = SimpleNamespace(now=0.0), []

    def side(name: str, costs: list[float]):
        def run() -> None:
            order.append(name)
            clock.now += costs.pop(0)

        return run

    first, second = side("A", [9.0, 0.03, 0.01, 0.02]), side("B", [9.0, 0.02, 0.04, 0.03])
    assert fastest_in_turns(first, second, clock=lambda: clock.now) == pytest.approx((0.01, 0.02))
    assert order == ["A", "B"] * 4  # one untimed turn each (not counted: 9.0), then A B A B A B
    monkeypatch.setattr(fast_paths_module, "BUDGET_S", 0.05)
    order.clear()
    first, second = side("A", [9.0, 0.03, 0.01]), side("B", [9.0, 0.03, 0.01])
    assert fastest_in_turns(first, second, clock=lambda: clock.now) == pytest.approx((0.03, 0.03))
    assert order == ["A", "B"] * 2  # the first timed turn already took the budget


def test_measuring_leaves_the_random_state_and_grad_mode_as_they_were():
    layer = nn.Linear(16, 24)
    before = torch.random.get_rng_state()
    measure_packing(layer)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.is_grad_enabled()


def test_shortlist_rows_follow_the_output_layers_decision(measured):
    model = small_transformer(tie_embeddings=False)
    pack_where_faster(model)
    for output in (model.output, nn.Linear(32, 40)):  # the model's (packed or not, as measured) and a plain one
        rows = OutputRows(torch.tensor([3, 7, 8]))
        with torch.inference_mode():
            rows.project(output, torch.randn(2, 32))
        cut = rows._cut[id(output)]  # the rows kept for the search
        assert isinstance(cut, PackedLinear) is isinstance(output, PackedLinear)
    assert isinstance(model.output, PackedLinear) is (shape_name(model.output) in packed_shapes(model))


@pytest.fixture
def untrained_run(reverse_task, tmp_path):
    """An untrained, seeded Transformer saved as a checkpoint of the reverse task: a model to load, in no time."""
    config = dataclasses.replace(reverse_task, model=ModelConfig(layers=2, d_model=32, heads=4, ffn_dim=64, dropout=0.0))
    tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
    torch.manual_seed(0)
    model = build_model(config.model, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=True)
    checkpoint = tmp_path / "untrained.pt"
    save_checkpoint(checkpoint_payload(config, tokenizers, weights=model.state_dict()), checkpoint)
    return checkpoint


def test_decoding_gives_the_same_tokens_packed_plain_or_as_measured(untrained_run, measured, monkeypatch):
    sources = ["a b c d", "e f g h i j", "k", "l m n o p q r s t"]
    outputs, packed = {}, {}
    for setting in ("packed", "plain", "1"):
        monkeypatch.setenv("MTKIT_FAST_PATHS", setting)
        translator = Translator.load(untrained_run, device="cpu", fast_paths=True)
        packed[setting] = packed_shapes(translator.engine.model)
        outputs[setting] = [
            [h.tokens for h in hypotheses]
            for beam in (1, 5)
            for hypotheses in translator.translate_nbest(sources, Decoding(beam=beam, nbest=min(beam, 3)))
        ]
    assert packed["plain"] == set() and packed["1"] < packed["packed"] == shapes(translator.engine.model)
    assert packed["1"] != set() and measured  # the default measured, and packed only the shapes that won
    assert outputs["packed"] == outputs["plain"] == outputs["1"]
    Translator.load(untrained_run, device="cpu", fast_paths=True)
    assert len(measured) == len(set(measured))  # the second load of the default read the cache
