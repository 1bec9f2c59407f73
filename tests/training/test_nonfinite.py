"""A non-finite update is skipped on the device and read one update late: never applied (weights, Adam's
moments and step, EMA, schedule), counted, no host sync on the way, and a normal update as before."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from torch import nn

import mtkit.training.loss
from mtkit.config import TrainConfig
from mtkit.training.ema import WeightEMA
from mtkit.training.progress import Progress
from mtkit.training.trainer import Trainer, build_optimizer
from mtkit.training.update import UpdateGuard


class Guarded:
    """A tiny model with the trainer's optimiser, schedule, scaler and EMA, updated as `Trainer.update` does."""

    def __init__(self, dtype: torch.dtype = torch.float32, scaler: torch.amp.GradScaler | None = None) -> None:
        torch.manual_seed(0)
        self.model = nn.Linear(4, 3).to(dtype)
        config = TrainConfig(lr=0.01, warmup_steps=4, clip_norm=1.0)
        self.optimizer, self.scheduler = build_optimizer(self.model, config, device=torch.device("cpu"))
        self.scaler = scaler or torch.amp.GradScaler("cpu", enabled=False)
        self.ema = WeightEMA(self.model, 0.9)
        self.guard = UpdateGuard(
            self.model, self.optimizer, scheduler=self.scheduler, scaler=self.scaler, ema=self.ema, clip_norm=config.clip_norm
        )
        self.progress, self.overflows = Progress(), []

    def update(self, poison: float = 1.0, scale_inputs: float = 1.0) -> None:
        inputs = torch.linspace(-1, 1, 8 * 4).reshape(8, 4) * scale_inputs
        with torch.autocast("cpu", torch.float16, enabled=self.scaler.is_enabled()):
            loss = self.model(inputs.to(self.model.weight.dtype)).float().square().sum() * poison
        self.scaler.scale(loss).backward()
        applied = self.guard.clip_and_check(loss.detach())
        self.overflows += self.guard.settle(self.progress)  # the previous update's outcome
        self.guard.step(applied, loss.detach())
        self.progress.step += 1

    def state(self) -> dict[str, torch.Tensor | int]:
        """Everything a skipped update must leave as it was."""
        state: dict[str, torch.Tensor | int] = {f"weight {i}": p.detach().clone() for i, p in enumerate(self.model.parameters())}
        for i, p in enumerate(self.model.parameters()):
            for key, value in self.optimizer.state[p].items():
                state[f"adam {key} {i}"] = value.clone()
        state |= {f"ema {i}": shadow.clone() for i, (_, shadow) in enumerate(self.ema.pairs)}
        return state | {"ema updates": self.ema.updates, "schedule": self.scheduler.last_epoch, "step": self.progress.step}


def assert_same(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value) if isinstance(value, torch.Tensor) else after[key] == value, key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_nan_update_is_never_applied_and_is_counted_one_update_late(dtype):
    run = Guarded(dtype)
    run.update()
    run.guard.settle(run.progress)
    before = run.state()
    run.update(poison=float("nan"))
    # applied on the device as a no-op; the host counted it and has not read its flag yet
    assert run.progress.step == 2 and run.progress.skipped_updates == 0
    skipped = run.state()
    assert_same(before, {**skipped, "ema updates": 1, "schedule": 1, "step": 1})
    assert torch.isfinite(run.model.weight).all()

    run.guard.settle(run.progress)  # read one update late (at the next update's settle, or at a log)
    assert run.progress.skipped_updates == 1 and run.progress.nonfinite_in_a_row == 1
    assert_same(before, run.state())
    lr_after_one = run.optimizer.param_groups[0]["lr"]
    run.update()  # the next update runs at the rate of the second, not the third
    assert run.progress.step == 2 and run.scheduler.last_epoch == 2 and run.ema.updates == 2
    run.guard.settle(run.progress)
    assert run.progress.nonfinite_in_a_row == 0 and run.progress.skipped_updates == 1
    reference = Guarded(dtype)
    reference.update()
    reference.guard.settle(reference.progress)
    assert reference.optimizer.param_groups[0]["lr"] == lr_after_one


def test_an_fp16_overflow_is_never_applied_and_the_scaler_halves_its_scale():
    run = Guarded(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10))
    run.update()
    run.guard.settle(run.progress)
    before = run.state()
    run.update(scale_inputs=1e3)  # fp16 gradients of 1e3 * 1e3 * 2**10 overflow
    run.update()  # its settle reads the overflow
    assert run.progress.skipped_updates == 1 and run.overflows == [(1, 2.0**9)]
    run.guard.settle(run.progress)
    assert run.progress.step == 2 and run.scheduler.last_epoch == 2 and run.ema.updates == 2
    assert before["adam step 0"] == 1 and run.optimizer.state[run.model.weight]["step"] == 2
    assert not torch.equal(before["weight 0"], run.model.weight)  # the third update was applied


def test_the_ema_in_foreach_kernels_equals_the_per_weight_lerp_within_rounding():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 2))
    ema, shadows = WeightEMA(model, 0.99), [p.detach().clone() for p in model.parameters()]
    applied = 0
    for update in range(1, 30):
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.1)
        skipped = update % 7 == 0  # every seventh update
        ema.update(torch.tensor(not skipped))
        if skipped:
            ema.take_back()
            continue
        applied += 1
        weight = 1.0 - min(0.99, (1 + applied) / (10 + applied))
        for shadow, param in zip(shadows, model.parameters(), strict=True):
            shadow.lerp_(param.detach(), weight)  # the average as it was computed before
    assert ema.updates == applied == 25
    for (_, shadow), expected in zip(ema.pairs, shadows, strict=True):
        torch.testing.assert_close(shadow, expected, rtol=1e-6, atol=1e-6)


def training(reverse_task, **settings) -> Trainer:
    config = copy.deepcopy(reverse_task)
    for key, value in {"ema": 0.9, "clip_norm": 1.0, "warmup_steps": 4, **settings}.items():
        setattr(config.train, key, value)
    torch.manual_seed(1)
    return Trainer(config, torch.device("cpu"))


def groups(trainer: Trainer, count: int) -> list:
    epoch = trainer.epoch()
    return [[epoch.ids.collate(batch)] for batch in epoch.batches[:count]]


def previous_update(trainer: Trainer, batches: list) -> torch.Tensor:
    """Trainer.update as it was before the device-side skip: the reference for a normal update."""
    trainer.model.train()
    total_tokens = sum(b.num_tokens for b in batches)
    loss_sum = torch.zeros(())
    for batch in batches:
        loss = trainer.forward_model(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out)
        trainer.scaler.scale(loss / total_tokens).backward()
        loss_sum += loss.detach()
    trainer.scaler.unscale_(trainer.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.train_config.clip_norm)
    assert bool(torch.isfinite(loss_sum) & torch.isfinite(grad_norm))
    trainer.scaler.step(trainer.optimizer)
    trainer.scaler.update()
    trainer.scheduler.step()
    trainer.ema.updates += 1
    weight = 1.0 - trainer.ema.current_decay()
    with torch.no_grad():
        for param, shadow in trainer.ema.pairs:
            shadow.lerp_(param.detach(), weight)
    trainer.optimizer.zero_grad(set_to_none=True)
    return loss_sum


def test_normal_updates_equal_the_previous_implementation(reverse_task):
    now, before = training(reverse_task), training(reverse_task)
    for group in groups(now, 5):
        loss, _ = now.update(group)
        assert torch.equal(loss, previous_update(before, group))
    for (name, value), expected in zip(now.model.state_dict().items(), before.model.state_dict().values(), strict=True):
        assert torch.equal(value, expected), name
    for (_, shadow), (_, expected) in zip(now.ema.pairs, before.ema.pairs, strict=True):
        torch.testing.assert_close(shadow, expected, rtol=1e-6, atol=1e-7)
    assert now.scheduler.last_epoch == before.scheduler.last_epoch == now.progress.step == 5


def test_an_update_reads_nothing_from_the_device_but_the_previous_flags(reverse_task, monkeypatch):
    trainer, reads = training(reverse_task), []
    batches = groups(trainer, 4)
    trainer.update(batches[0])  # the first update builds Adam's state

    def refuse(name):
        original = getattr(torch.Tensor, name)

        def guarded(self, *args):
            caller = sys._getframe(1).f_code
            if caller is not UpdateGuard.settle.__code__:
                raise AssertionError(f"Tensor.{name} in the update path ({caller.co_filename}:{caller.co_name})")
            reads.append(name)
            return original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, guarded)

    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        refuse(name)
    for group in batches[1:]:
        trainer.update(group)
    monkeypatch.undo()
    assert reads == ["tolist"] * 3  # each update read only the update before it, from its host copy
    assert trainer.progress.step == 4


def test_a_run_of_non_finite_updates_stops_after_max_nonfinite_as_before(reverse_task, monkeypatch):
    trainer = training(reverse_task, max_nonfinite=3, max_steps=20, validate_every=20, log_every=20)
    monkeypatch.setattr(
        mtkit.training.loss, "sequence_loss", lambda logits, target, *, label_smoothing: logits.sum() * float("inf")
    )
    progress = trainer.run()
    assert trainer.diverged and progress.skipped_updates == 3 and progress.step == 0
    assert progress.batches_done == 3 and trainer.scheduler.last_epoch == 0 and trainer.ema.updates == 0


def test_a_skipped_update_is_counted_once_and_training_reaches_max_steps(reverse_task, monkeypatch):
    trainer = training(reverse_task, max_steps=6, validate_every=6, log_every=3)
    real_loss, calls = mtkit.training.loss.sequence_loss, {"n": 0}

    def sometimes_nan(logits, target, *, label_smoothing):
        calls["n"] += 1
        return real_loss(logits, target, label_smoothing=label_smoothing) * (float("nan") if calls["n"] in (2, 6) else 1.0)

    monkeypatch.setattr(mtkit.training.loss, "sequence_loss", sometimes_nan)
    progress = trainer.run()
    assert (progress.step, progress.skipped_updates, calls["n"]) == (6, 2, 8)
    assert trainer.scheduler.last_epoch == trainer.ema.updates == 6
    for value in trainer.model.state_dict().values():
        assert torch.isfinite(value.float()).all()
