"""Property-based tests: hostile text in (any Unicode, control characters, NUL, BOM, CRLF, lone
surrogates, very long lines) never crashes mtkit, and `translate` keeps one line per input line."""

from __future__ import annotations

import dataclasses
import math
import os
import typing
import unicodedata
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mtkit.cli import app
from mtkit.config import Config, DataConfig, SplitConfig, arch_keys, load_config
from mtkit.data.corpora import clean_pairs, iter_split
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.evaluation.metrics import score_corpus
from mtkit.textio import decode_lines


def read_split(split: SplitConfig, src_lang: str, tgt_lang: str, **options) -> list:
    """A whole split, as a list."""
    return list(iter_split(split, src_lang, tgt_lang=tgt_lang, **options))


# Everything Unicode has, lone surrogates included; newlines are what separate lines.
ANY_CHARACTER = st.characters(codec=None, exclude_characters="\n")
HOSTILE = st.sampled_from(["\x00", "\ufeff", "\r", "\t", "\u200f", "\u0301", "\U0001f600", "\u2028", "\x85", "\x1b[31m"])
LINE = st.lists(st.one_of(ANY_CHARACTER, HOSTILE), max_size=30).map("".join)
LINES = st.lists(LINE, min_size=0, max_size=6)
FAST = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def to_bytes(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8", errors="surrogatepass")


def has_surrogate(text: str) -> bool:
    return any(unicodedata.category(c) == "Cs" for c in text)


@pytest.mark.slow
@FAST
@given(pairs=st.lists(st.tuples(LINE, LINE), max_size=8))
def test_reading_parallel_files_keeps_pairs_aligned_or_names_the_bad_line(tmp_path, pairs):
    src, tgt = tmp_path / "corpus.src", tmp_path / "corpus.tgt"
    src.write_bytes(to_bytes([s for s, _ in pairs]))
    tgt.write_bytes(to_bytes([t for _, t in pairs]))
    try:
        read = read_split(SplitConfig(src=str(src), tgt=str(tgt)), "de", "en", normalize="NFC")
    except MtkitError as err:
        message = str(err)
        assert "\n" not in message
        assert "not valid UTF-8" in message and ("corpus.src:" in message or "corpus.tgt:" in message)
        assert any(has_surrogate(s) or has_surrogate(t) for s, t in pairs)
        return
    assert len(read) == len(pairs)
    for (src_text, tgt_text), (raw_src, raw_tgt) in zip(read, pairs, strict=True):
        assert "\n" not in src_text and "\n" not in tgt_text
        assert src_text == unicodedata.normalize("NFC", src_text) and tgt_text == unicodedata.normalize("NFC", tgt_text)
        assert len(src_text) <= len(unicodedata.normalize("NFC", raw_src)) and len(tgt_text) <= len(
            unicodedata.normalize("NFC", raw_tgt)
        )


@pytest.mark.slow
@FAST
@given(pairs=st.lists(st.tuples(LINE, LINE), max_size=12), max_len=st.integers(1, 10), max_ratio=st.floats(1.0, 4.0))
def test_cleaning_accounts_for_every_pair(pairs, max_len, max_ratio):
    kept, report = clean_pairs(pairs, DataConfig(max_len=max_len, max_ratio=max_ratio))
    removed = report.empty + report.too_long + report.ratio + report.duplicate + report.copy
    assert report.total == len(pairs) and report.kept == len(kept) == report.total - removed
    assert len(set(kept)) == len(kept)
    for source, target in kept:
        words = len(source.split()), len(target.split())
        assert min(words) > 0 and max(words) <= max_len and max(words) / min(words) <= max_ratio
        assert source != target


@pytest.fixture(scope="module")
def greedy_translator(reverse_run) -> Translator:
    translator = Translator.load(reverse_run.run_path)
    translator.decode.beam = 1
    translator.decode.max_len_b = 4
    return translator


@pytest.mark.slow
@FAST
@given(lines=LINES)
def test_translate_returns_exactly_one_line_per_input_line(greedy_translator, lines):
    output = greedy_translator.translate(lines)
    assert len(output) == len(lines)
    for source, translation in zip(lines, output, strict=True):
        assert "\n" not in translation
        if not source.strip():
            assert translation == ""


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=120))
def test_translate_command_never_shows_a_traceback(reverse_run, data):
    result = CliRunner().invoke(app, ["translate", "-m", str(reverse_run.run_path), "--beam", "1"], input=data)
    if result.exit_code == 0:
        expected = decode_lines(data, "<stdin>")
        assert result.stdout.count("\n") == len(expected)
    else:
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
        assert result.stderr.startswith("mtkit: error: <stdin>:") and result.stderr.count("\n") == 1


@pytest.mark.slow
@FAST
@given(rows=st.lists(st.tuples(LINE, LINE, LINE), min_size=1, max_size=6))
def test_scores_are_finite_for_any_text(rows):
    hypotheses = [h.encode("utf-8", "replace").decode() for h, _, _ in rows]
    references = [
        [r.encode("utf-8", "replace").decode() for _, r, _ in rows],
        [r.encode("utf-8", "replace").decode() for _, _, r in rows],
    ]
    result = score_corpus(hypotheses, references)
    for score in result.scores:
        assert math.isfinite(score.score) and score.score >= 0
        assert score.signature


# Any value for any recipe key: one clear line at load, or a model that trains


def recipe_keys(section: type = Config, prefix: str = "") -> list[tuple[str, tuple, dataclasses.Field]]:
    """Every key of a recipe (sections included) with the types it allows, walked from the dataclasses."""
    keys = []
    hints = typing.get_type_hints(section)
    for spec in dataclasses.fields(section):
        options = typing.get_args(hints[spec.name]) or (hints[spec.name],)
        keys.append((prefix + spec.name, options, spec))
        for option in options:
            if dataclasses.is_dataclass(option):
                keys += recipe_keys(option, f"{prefix}{spec.name}.")
    return keys


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))


def values_for(options: tuple, spec: dataclasses.Field) -> st.SearchStrategy:
    """Values of the key's own types (zero, negatives, huge, NaN and infinities included), or anything else."""
    typed = []
    if int in options:
        typed.append(st.integers(-3, 40) | st.sampled_from([10**6, 2**40, 10**30]))
    if float in options:
        typed.append(st.floats(-2.0, 2.0) | st.sampled_from([0.0, 1.0, 1e30, math.nan, math.inf, -math.inf]))
    if str in options:
        known = ([spec.default] if isinstance(spec.default, str) else []) + list(spec.metadata.get("choices", ()))
        typed.append(st.text(max_size=8) | st.sampled_from(known) if known else st.text(max_size=8))
    if bool in options:
        typed.append(st.booleans())
    return st.one_of(*typed, ANY_VALUE)


KEY_VALUES = {key: values_for(options, spec) for key, options, spec in recipe_keys()}
OVERRIDE = st.sampled_from(sorted(KEY_VALUES)).flatmap(lambda key: st.tuples(st.just(key), KEY_VALUES[key]))


def affordable(config: Config) -> bool:
    """Whether one update is cheap enough to try here: bigger recipes are skipped, not failed."""
    model, train = config.model, config.train
    sizes = [
        getattr(model, key)
        for key in ("d_model", "ffn_dim", "hidden_size", "embed_dim", "max_positions")
        if key in arch_keys(model.arch)
    ]
    depth = max(model.layers, model.encoder_layers, model.decoder_layers)  # a million decoder layers: 24 GB
    cheap_train = train.batch_tokens <= 4000 and train.accumulate <= 4 and train.compile != "true"
    return depth <= 4 and max(sizes) <= 4096 and sorted(sizes)[-2] <= 256 and cheap_train


def first_update(config: Config) -> Any:
    """A `Trainer` for `config` (no run directory) after its first update, over the first `accumulate` batches."""
    from mtkit.runtime import resolve_device
    from mtkit.training.trainer import Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only wait for each other on a busy machine
    try:
        trainer = Trainer(config, resolve_device(config.train.device))
        epoch = trainer.epoch()
        batches = epoch.batches
        assume(batches)  # a learned max_positions may be shorter than every pair: skipped by design
        trainer.update([epoch.ids.collate(batch) for batch in batches[: config.train.accumulate]])
    finally:
        torch.set_num_threads(threads)
    return trainer


def layers_of(model: torch.nn.Module) -> int:
    from mtkit.models.transformer import Transformer

    if isinstance(model, Transformer):
        return min(len(model.encoder_layers), len(model.decoder_layers))
    return model.encoder.rnn.num_layers


@settings(
    derandomize=os.environ.get("CI") == "true",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@pytest.mark.slow
@given(arch=st.sampled_from(["transformer", "rnn"]), overrides=st.lists(OVERRIDE, max_size=3))
def test_any_recipe_values_fail_at_load_in_one_line_or_train(tiny_recipes, arch, overrides):
    """Never a traceback and never a silent absurd model: one error line at load, or a real first update."""
    from mtkit.training.schedule import schedule_factor

    recipe = tiny_recipes[arch]
    items = [f"{key}={yaml.safe_dump(value)}" for key, value in overrides]
    items += [f"data_dir={recipe.parent / 'data'}", f"run_dir={recipe.parent / 'run'}"]
    try:
        config = load_config(recipe, items)
    except MtkitError as err:
        assert "\n" not in str(err) and str(err).startswith(f"{recipe}: ")
        event("load error")
        return
    assume(affordable(config))
    try:
        trainer = first_update(config)
    except MtkitError as err:  # the recipe is fine, the machine lacks it (e.g. train.device=cuda)
        assert "\n" not in str(err)
        event("train error")
        return
    event("trained")
    assert trainer.progress.step + trainer.progress.skipped_updates == 1
    assert layers_of(trainer.model) >= 1
    assert 0 < config.train.lr * schedule_factor(config.train, trainer.elapsed)(0) < math.inf
