"""Training: the schedule, the loss, learning a task to exact match, checkpoints and exact resume."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle

import pytest
import torch
import torch.nn.functional as F
from helpers import prepared_reverse_task, reverse_task_config, write_reverse_task

from mtkit.config import TrainConfig, config_from_dict
from mtkit.data.tokenizer import PAD_ID
from mtkit.decoding.translator import Translator
from mtkit.errors import MtkitError
from mtkit.models.checkpoint import read_checkpoint, save_checkpoint
from mtkit.training.levers import Levers
from mtkit.training.loss import fused_sequence_loss, sequence_loss
from mtkit.training.run_writer import RunWriter
from mtkit.training.schedule import schedule_factor
from mtkit.training.trainer import PlainProgress, Trainer, build_optimizer, setup_process, train


def test_schedule_warms_up_linearly_then_decays_with_inverse_sqrt():
    factor = schedule_factor(TrainConfig(warmup_steps=100), lambda: 0.0)  # called with the updates already made
    assert factor(0) == pytest.approx(0.01)
    assert factor(49) == pytest.approx(0.5)
    assert factor(99) == pytest.approx(1.0)
    assert factor(399) == pytest.approx(0.5)
    assert factor(9_999) == pytest.approx(0.1)


def test_label_smoothed_loss_matches_the_definition_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7)
    target = torch.tensor([[4, 5, 6], [5, PAD_ID, PAD_ID]])
    smoothing = 0.1
    log_probs = F.log_softmax(logits, dim=-1)
    expected = 0.0
    for row, column in [(0, 0), (0, 1), (0, 2), (1, 0)]:
        nll = -log_probs[row, column, target[row, column]]
        uniform = -log_probs[row, column].mean()
        expected += (1 - smoothing) * nll + smoothing * uniform
    assert sequence_loss(logits, target, smoothing).item() == pytest.approx(expected.item(), rel=1e-5)
    # Changing logits at padded positions changes nothing.
    changed = logits.clone()
    changed[1, 1:] += 100.0
    assert sequence_loss(changed, target, smoothing).item() == pytest.approx(expected.item(), rel=1e-5)


def test_the_fused_loss_of_a_compiled_step_equals_the_chunked_loss_and_its_gradient():
    torch.manual_seed(3)
    logits = torch.randn(4, 9, 37, dtype=torch.float64).float()
    target = torch.randint(3, 37, (4, 9))
    target[1, 5:] = PAD_ID
    found = []
    for loss in (sequence_loss, fused_sequence_loss):
        leaf = logits.clone().requires_grad_()
        value = loss(leaf, target, 0.1)
        value.backward()
        found.append((value.item(), leaf.grad))
    assert found[1][0] == pytest.approx(found[0][0], rel=1e-5)
    assert torch.allclose(found[1][1], found[0][1], atol=1e-6)
    assert found[0][1][1, 5:].abs().max() == 0  # pads get no gradient


OFF = {"compile": "false", "length_multiple": 1, "prefetch": "false"}
ON_16 = {"compile": "true", "length_multiple": 16, "prefetch": "true"}


@pytest.mark.parametrize(
    "device, keys, expected",
    [
        ("cpu", {}, Levers(compile=False, length_multiple=1, prefetch=False)),
        ("cuda", {}, Levers(compile=True, length_multiple=1, prefetch=True)),
        ("cuda", OFF, Levers(compile=False, length_multiple=1, prefetch=False)),
        ("cpu", ON_16, Levers(compile=True, length_multiple=16, prefetch=True)),
        ("cuda", {"max_time": "29m"}, Levers(compile=False, length_multiple=1, prefetch=True)),
        ("cuda", {"max_time": "30m"}, Levers(compile=True, length_multiple=1, prefetch=True)),
        ("cuda", {"max_time": "5m", "compile": "true"}, Levers(compile=True, length_multiple=1, prefetch=True)),
    ],
)
def test_the_gpu_levers_are_on_with_cuda_by_default_and_each_can_be_set(device, keys, expected):
    assert Levers.of(TrainConfig(**keys), torch.device(device)) == expected


def test_the_lever_keys_take_yaml_true_and_false_and_refuse_other_words():
    config = config_from_dict({"train": {"compile": True, "prefetch": False, "length_multiple": 8}})
    assert (config.train.compile, config.train.prefetch, config.train.length_multiple) == ("true", "false", 8)
    with pytest.raises(MtkitError, match="'train.compile' is 'yes'; choose one of auto, true, false"):
        config_from_dict({"train": {"compile": "yes"}})


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


def test_resume_without_a_run_is_a_clear_error(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=1)
    with pytest.raises(MtkitError, match="nothing to resume"):
        train(config, resume=True)


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


def test_a_model_too_short_for_every_pair_is_a_clear_error_not_an_endless_loop(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=0)
    config.model.positions, config.model.max_positions = "learned", 2  # every pair needs 4 or more positions
    with pytest.raises(MtkitError, match=r"^no training pair fits the model: all [0-9]+ need more than model.max_positions=2 "):
        train(config)


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_checkpoint_that_would_run_code_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    crafted = tmp_path / "evil.pt"
    crafted.write_bytes(b"")
    torch.save({"format": "mtkit-checkpoint-1", "payload": _RunsCode()}, crafted)
    with pytest.raises(MtkitError, match="refused to load"):
        read_checkpoint(crafted)
    assert not (tmp_path / "PWNED").exists()
    plain_pickle = tmp_path / "evil2.pt"
    plain_pickle.write_bytes(pickle.dumps(_RunsCode()))
    with pytest.raises(MtkitError):
        read_checkpoint(plain_pickle)
    assert not (tmp_path / "PWNED").exists()


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"format": "mtkit-checkpoint-1", "step": 1}, path)

    def broken_save(payload, file):
        file.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(MtkitError, match=r"last\.pt: cannot write \(No space left on device\)"):
        save_checkpoint({"format": "mtkit-checkpoint-1", "step": 2}, path)
    monkeypatch.undo()
    assert read_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


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
        trainer = Trainer(config, device, distributed, RunWriter(config.run_path))
        epoch = trainer.epoch()
        batch = epoch.ids.collate(epoch.batches[0])
        loss = trainer.forward_model(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out)  # eager: sequence_loss
        loss.backward()
        found[compiled] = loss.item(), {name: p.grad.clone() for name, p in trainer.model.named_parameters()}
        trainer.optimizer.zero_grad(set_to_none=True)
        progress = trainer.run()
        assert progress.step == 3 and (config.run_path / "best.pt").is_file()
    assert isinstance(trainer.forward_model, torch._dynamo.eval_frame.OptimizedModule)
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


def test_average_last_needs_the_checkpoints_it_averages():
    from mtkit.config import config_from_dict

    with pytest.raises(MtkitError, match="give train.keep >= train.average_last"):
        config_from_dict({"train": {"average_last": 3, "keep": 2}})


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


def test_adam_is_fused_on_cpu_and_takes_the_same_step_as_the_loop():
    """The trainer's CPU Adam uses torch's fused kernel (torch 2.4+) and updates as the per-tensor loop does."""
    torch.manual_seed(0)
    fused_model, loop_model = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    loop_model.load_state_dict(fused_model.state_dict())
    start = fused_model.weight.detach().clone()
    config = TrainConfig(lr=1e-2, warmup_steps=1)
    optimizer, _ = build_optimizer(fused_model, config, torch.device("cpu"))
    assert optimizer.defaults["fused"] is True
    loop = torch.optim.Adam(loop_model.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9, foreach=False)
    inputs = torch.randn(16, 8)
    for model, opt in ((fused_model, optimizer), (loop_model, loop)):
        for _ in range(3):
            opt.zero_grad()
            model(inputs).square().mean().backward()
            opt.step()
    assert not torch.equal(fused_model.weight, start)  # the steps moved the weights
    torch.testing.assert_close(fused_model.weight, loop_model.weight, rtol=1e-5, atol=1e-6)


def test_plain_progress_is_due_once_a_minute_and_says_step_loss_speed_and_time_left(monkeypatch, capsys):
    clock = {"now": 1000.0}
    monkeypatch.setattr("mtkit.training.trainer.time.monotonic", lambda: clock["now"])
    plain = PlainProgress(enabled=True)
    clock["now"] += 59.0
    assert not plain.due()
    clock["now"] += 1.0
    assert plain.due()
    record = {"step": 800, "epoch": 2, "train_loss": 3.21, "tokens_per_s": 1510.4}
    plain.say(record, elapsed=180.0, max_time=900.0)
    assert capsys.readouterr().err == "step 800 (epoch 2): loss 3.210, 1510 tokens/s, 3.0 min elapsed, 12.0 min left\n"
    assert not plain.due()  # the minute starts again
    assert not PlainProgress(enabled=False).due()


@pytest.mark.slow
def test_training_piped_to_a_file_prints_plain_progress_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(PlainProgress, "due", lambda self: self.enabled)  # every update, instead of every minute
    config = prepared_reverse_task(tmp_path, max_steps=3, validate_every=3, log_every=1)
    train(config)  # under pytest stderr is captured, not a terminal: the progress bar is off
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ") and "tokens/s" in line]
    assert [line.split(" (")[0] for line in lines] == ["step 1", "step 2", "step 3"]
