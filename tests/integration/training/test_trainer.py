"""Training end to end: learning a task to exact match, the run directory, checkpoints and exact resume,
weighted corpora, compiled training, averages and snapshots."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from helpers import prepared_reverse_task, reverse_task_config, write_reverse_task

from mtkit.data.tokenizer import PAD_ID
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.models.checkpoint import read_checkpoint, save_checkpoint
from mtkit.training.compile_cache import CompileCache
from mtkit.training.run_writer import RunWriter
from mtkit.training.trainer import PlainProgress, Trainer, setup_process, train


@pytest.mark.slow
def test_prefetch_trains_to_the_same_weights_and_rounded_lengths_to_the_same_within_rounding(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=6, validate_every=6)
    config.model.dropout = 0.0  # rounded lengths change the shape dropout draws its mask for
    weights = {}
    for levers in (("false", 1), ("true", 1), ("true", 8)):
        config.train.prefetch, config.train.length_multiple = levers
        config.run_dir = str(tmp_path / f"run_{levers[0]}_{levers[1]}")
        train(config)
        weights[levers] = read_checkpoint(config.run_path / "last.pt")["model"]
    plain, prefetched, rounded = weights.values()
    for name, tensor in plain.items():
        assert torch.equal(prefetched[name], tensor), name  # the same computation, collated earlier
        # more padding sums in another order; Adam scales the rounding noise of gradients that are zero in exact
        # arithmetic (a key bias: softmax ignores it) up to lr-sized steps, so compare with a step's size
        assert torch.allclose(rounded[name], tensor, atol=config.train.lr / 10), name


def test_reverse_task_is_learned_to_exact_match(reverse_run):
    sources = (reverse_run.data_path.parent / "raw/valid.src").read_text().splitlines()
    targets = (reverse_run.data_path.parent / "raw/valid.tgt").read_text().splitlines()
    translator = Translator.load(reverse_run.run_path)
    assert translator.translate(sources, beam=1) == targets
    assert translator.translate(sources, beam=4) == targets


def test_run_directory_is_self_describing(reverse_run):
    run = reverse_run.run_path
    assert {"best.pt", "last.pt", "config.yaml", "log.jsonl"} <= {p.name for p in run.iterdir()}
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert any("train_loss" in r and "tokens_per_s" in r and "lr" in r for r in records)
    validations = [r for r in records if "valid_bleu" in r]
    assert [r["step"] for r in validations] == [250, 500, 750]
    payload = read_checkpoint(run / "best.pt")
    assert payload["config"]["model"]["d_model"] == 64
    assert payload["tokenizers"]["src"] == (reverse_run.data_path / "spm.model").read_bytes()
    assert payload["progress"]["best_bleu"] == pytest.approx(max(r["valid_bleu"] for r in validations), abs=0.01)
    assert "optimizer" in read_checkpoint(run / "last.pt") and "optimizer" not in payload


def test_checkpoint_round_trip_gives_identical_outputs(reverse_run, tmp_path):
    translator = Translator.load(reverse_run.run_path / "last.pt")
    copy = tmp_path / "copy.pt"
    save_checkpoint(read_checkpoint(reverse_run.run_path / "last.pt"), copy)
    reloaded = Translator.load(copy)
    src = torch.tensor([[5, 6, 7, 3]])
    mask = src.ne(PAD_ID)
    with torch.inference_mode():
        torch.testing.assert_close(reloaded.engine.model(src, mask, src), translator.engine.model(src, mask, src), rtol=0, atol=0)


def test_existing_run_is_not_overwritten_without_resume(reverse_run):
    with pytest.raises(MtkitError, match="--resume"):
        train(reverse_run)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["inverse_sqrt", "cosine", "subword sampling"])
def test_resume_after_interruption_matches_an_uninterrupted_run(tmp_path, monkeypatch, schedule):
    settings = {"max_steps": 40, "validate_every": 20, "log_every": 5, "batch_tokens": 300}
    settings |= {"schedule": "cosine", "min_lr": 1e-4, "warmup_steps": 10} if schedule == "cosine" else {}
    straight = prepared_reverse_task(tmp_path / "straight", **settings)
    straight.model.dropout = 0.2  # dropout makes the RNG state part of what must be restored
    straight.tokenizer.sampling_alpha = 0.2 if schedule == "subword sampling" else 0.0  # the pieces must repeat too
    train(straight)

    interrupted = prepared_reverse_task(tmp_path / "interrupted", **settings)
    interrupted.model.dropout, interrupted.tokenizer.sampling_alpha = 0.2, straight.tokenizer.sampling_alpha
    limit = Trainer._limit_reached  # stopped at update 20 as by Ctrl-C: the recipe (and its schedule) unchanged
    monkeypatch.setattr(Trainer, "_limit_reached", lambda trainer: trainer.progress.step >= 20 or limit(trainer))
    train(interrupted)
    monkeypatch.undo()
    train(interrupted, resume=True)

    final_straight = read_checkpoint(straight.run_path / "last.pt")
    final_resumed = read_checkpoint(interrupted.run_path / "last.pt")
    assert final_resumed["step"] == final_straight["step"] == 40
    for name, value in final_straight["model"].items():
        torch.testing.assert_close(final_resumed["model"][name], value, rtol=0, atol=0, msg=name)

    def losses(config):
        lines = (config.run_path / "log.jsonl").read_text().splitlines()
        return [(r["step"], r["train_loss"]) for r in map(json.loads, lines) if "train_loss" in r]

    assert losses(interrupted) == losses(straight)


@pytest.mark.slow
def test_max_epochs_stops_training(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=0, max_epochs=1, batch_tokens=4000, validate_every=1000)
    progress = train(config)
    assert progress.epoch == 1
    assert 0 < progress.step < 100


@pytest.mark.slow
def test_two_weighted_corpora_train_together_and_each_epoch_draws_by_the_weights(tmp_path):
    from mtkit.config import TrainSource
    from mtkit.data.prepare import prepare_corpus, train_tokenizers

    write_reverse_task(tmp_path / "raw", train_pairs=600, seed=0)
    write_reverse_task(tmp_path / "raw2", train_pairs=300, seed=1)
    config = reverse_task_config(tmp_path, max_steps=0, max_epochs=3, batch_tokens=2000, validate_every=1000)
    small = TrainSource(src=str(tmp_path / "raw2/train.src"), tgt=str(tmp_path / "raw2/train.tgt"), name="small", weight=2.0)
    config.data.train = [dataclasses.replace(config.data.train[0], name="large", weight=0.5), small]
    train_tokenizers(config)
    report = prepare_corpus(config)
    kept = {corpus["name"]: corpus["clean"]["kept"] for corpus in report["corpora"]}
    assert kept["large"] > 500 and kept["small"] > 250  # the reverse task repeats a few short pairs
    train(config)
    records = [json.loads(line) for line in (config.run_path / "log.jsonl").read_text().splitlines()]
    draws = [record["corpus_pairs"] for record in records if "corpus_pairs" in record]
    assert draws == [{"large": round(0.5 * kept["large"]), "small": 2 * kept["small"]}] * 3
    with pytest.raises(MtkitError, match="the recipe trains on corpora large but the data was prepared from large, small"):
        train(dataclasses.replace(config, data=dataclasses.replace(config.data, train=config.data.train[:1])), overwrite=True)


def test_learning_rate_follows_the_schedule_during_training(reverse_run):
    records = [json.loads(line) for line in (reverse_run.run_path / "log.jsonl").read_text().splitlines()]
    lr_at = {r["step"]: r["lr"] for r in records if "lr" in r}
    peak, warmup = reverse_run.train.lr, reverse_run.train.warmup_steps
    assert lr_at[50] == pytest.approx(peak * min(51 / warmup, math.sqrt(warmup / 51)), rel=1e-6)
    assert lr_at[750] == pytest.approx(peak * math.sqrt(warmup / 751), rel=1e-6)


@pytest.mark.slow
def test_compiled_training_computes_the_eager_loss_and_gradients_and_trains(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=3, validate_every=3)
    config.model.dropout = 0.0  # compiled dropout draws other random numbers
    found = {}
    for compiled in (False, True):
        config.train.compile = "true" if compiled else "false"
        config.run_dir = str(tmp_path / f"run_compiled_{compiled}")
        distributed, device = setup_process(config.train)
        trainer = Trainer(config, device, distributed=distributed, run_dir=RunWriter(config.run_path))
        epoch = trainer.epoch()
        batch = epoch.ids.collate(epoch.batches[0])
        loss = trainer.forward_model(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out)  # eager: sequence_loss
        loss.backward()
        found[compiled] = loss.item(), {name: p.grad.clone() for name, p in trainer.model.named_parameters()}
        trainer.optimizer.zero_grad(set_to_none=True)
        progress = trainer.run()
        assert progress.step == 3 and (config.run_path / "best.pt").is_file()
    assert isinstance(trainer.forward_model, torch._dynamo.eval_frame.OptimizedModule)
    cache = CompileCache.of(config, device, levers=trainer.levers)  # train.compile_cache: the compile's artifacts, saved
    cache.save()
    info = torch.compiler.load_cache_artifacts(cache.path.read_bytes())  # and readable by torch
    assert sum(len(keys) for keys in info.artifacts.values()) > 0
    assert found[True][0] == pytest.approx(found[False][0], rel=1e-5)
    for name, grad in found[False][1].items():  # summation order differs: compare to the tensor's scale
        assert (found[True][1][name] - grad).abs().max() <= 1e-5 * grad.abs().max(), name


@pytest.mark.slow
def test_average_last_writes_a_validated_average_and_the_run_uses_the_better_checkpoint(tmp_path):
    from mtkit.models.checkpoint import resolve_checkpoint

    config = prepared_reverse_task(tmp_path, max_steps=30, validate_every=10, keep=2, average_last=2)
    train(config)
    average = read_checkpoint(config.run_path / "average.pt")
    assert average["averaged_from"] == ["step_00000020.pt", "step_00000030.pt"] and 0 <= average["valid_bleu"] <= 100
    records = [json.loads(line) for line in (config.run_path / "log.jsonl").read_text().splitlines()]
    assert records[-1]["average_valid_bleu"] == average["valid_bleu"]
    best_bleu = read_checkpoint(config.run_path / "best.pt")["progress"]["best_bleu"]
    expected = "average.pt" if average["valid_bleu"] >= best_bleu else "best.pt"
    assert resolve_checkpoint(config.run_path).name == expected
    for bleu, chosen in ((best_bleu + 1, "average.pt"), (best_bleu - 1, "best.pt")):
        save_checkpoint({**average, "valid_bleu": bleu}, config.run_path / "average.pt")
        assert resolve_checkpoint(config.run_path).name == chosen
    assert resolve_checkpoint(config.run_path / "best.pt").name == "best.pt"  # a file is taken as given


@pytest.mark.slow
def test_a_snapshot_due_when_the_last_validation_runs_out_the_time_holds_the_final_weights(tmp_path, monkeypatch):
    import mtkit.training.trainer as train_module

    clock = {"validating": 0.0}  # one second per update, and half a second per validation
    monkeypatch.setattr(Trainer, "elapsed", lambda self: self.progress.step + clock["validating"])
    original = train_module.validate

    def slow_validate(*args, **kwargs):
        clock["validating"] += 0.5
        return original(*args, **kwargs)

    monkeypatch.setattr(train_module, "validate", slow_validate)
    # at update 10 the clock says 10.5 s; its validation makes it 11 s, which ends the run
    config = prepared_reverse_task(tmp_path, max_steps=50, validate_every=5, snapshots="11s", max_time="11s")
    train(config)
    snapshot = read_checkpoint(config.run_path / "at_11s.pt")
    last = read_checkpoint(config.run_path / "last.pt")
    assert snapshot["step"] == last["step"] == 10
    assert all(torch.equal(last["model"][name], value) for name, value in snapshot["model"].items())


@pytest.mark.slow
def test_snapshots_hold_the_weights_at_each_training_time_and_a_bad_time_is_refused(tmp_path, monkeypatch):
    from mtkit.config import config_from_dict

    monkeypatch.setattr(Trainer, "elapsed", lambda self: float(self.progress.step))  # a clock of one second per update
    config = prepared_reverse_task(tmp_path, max_steps=20, validate_every=5, keep=4, snapshots="12s, 5s")
    train(config)
    for label, step in (("5s", 5), ("12s", 12)):
        snapshot = read_checkpoint(config.run_path / f"at_{label}.pt")
        assert snapshot["step"] == step == snapshot["progress"]["step"]
    kept = read_checkpoint(config.run_path / "step_00000005.pt")["model"]
    assert all(torch.equal(kept[name], value) for name, value in read_checkpoint(config.run_path / "at_5s.pt")["model"].items())
    assert Translator.load(config.run_path / "at_12s.pt").translate(["a b"])  # loadable as any checkpoint
    with pytest.raises(MtkitError, match=r"'train.snapshots' is '15m;30m'.*15m,30m,60m"):
        config_from_dict({"train": {"snapshots": "15m;30m"}})


@pytest.mark.slow
def test_training_piped_to_a_file_prints_plain_progress_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(PlainProgress, "due", lambda self: self.enabled)  # every update, instead of every minute
    config = prepared_reverse_task(tmp_path, max_steps=3, validate_every=3, log_every=1)
    train(config)  # under pytest stderr is captured, not a terminal: the progress bar is off
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ") and "tokens/s" in line]
    assert [line.split(" (")[0] for line in lines] == ["step 1", "step 2", "step 3"]
