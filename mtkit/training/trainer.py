"""The training loop: label-smoothed teacher forcing, Adam with a warmup-and-decay schedule (`mtkit.training.schedule`),
token-budget batches, early stopping, exact resume, an EMA of the weights and torchrun (DDP).

`train()` puts the pieces together: `setup_process`, the run directory (`mtkit.training.run_writer`), a
`Trainer` (model, optimiser, schedule and loop) and, at each validation, `mtkit.training.validation`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.profiler import record_function
from tqdm import tqdm

from mtkit.config import Config, TrainConfig, parse_duration
from mtkit.data.store import load_prepared
from mtkit.data.tokenizer import load_tokenizers
from mtkit.distributed import (
    Distributed,
    StopAgreement,
    barrier,
    broadcast_from_main,
    init_distributed,
    shutdown,
    sum_over_ranks,
    tokens_over_ranks,
)
from mtkit.errors import MtkitError
from mtkit.models import build_model
from mtkit.models.base import EncoderDecoder
from mtkit.models.checkpoint import (
    average_checkpoints,
    read_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from mtkit.run_files import RunFiles
from mtkit.runtime import (
    autocast_dtype,
    avoid_per_shape_attention_plans,
    enable_tf32,
    fast_paths_enabled,
    key_compiled_cpu_code_by_vector_width,
    resolve_device,
    retain_freed_memory,
    return_freed_memory,
    seed_everything,
    set_threads,
    stop_signals_call,
)
from mtkit.textio import say
from mtkit.training.batch_ahead import BatchAhead
from mtkit.training.batches import Batch, Epoch, TrainingData
from mtkit.training.compile_cache import CompileCache
from mtkit.training.ema import WeightEMA
from mtkit.training.finetune import Lineage
from mtkit.training.fused_loss import FusedTeacherForcing, fused_loss_on
from mtkit.training.levers import Levers
from mtkit.training.loss import TeacherForcing
from mtkit.training.master_weights import MasterWeightOptimizer, bf16_weights_on, weights_dtype
from mtkit.training.progress import Progress
from mtkit.training.recompute import recompute_blocks
from mtkit.training.regional import can_compile_by_layer, compile_by_layer, eager
from mtkit.training.run_writer import Checkpoint, RunWriter
from mtkit.training.schedule import schedule_factor
from mtkit.training.sharding import SavedWeights, check_sharding, hold_model, shard_training
from mtkit.training.update import UpdateGuard
from mtkit.training.validation import (
    ValidationMetric,
    best_text,
    check_valid_sets,
    final_weights_report,
    validate,
    validation_line,
)

# fused Adam on CPU came with torch 2.4; the package allows 2.3
_FUSED_ADAM_ON_CPU = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 4)


def setup_process(config: TrainConfig) -> tuple[Distributed, torch.device]:
    """Join the torchrun job if there is one, then set threads, memory reuse (or with train.shard=fsdp on the CPU
    memory handed back: `runtime.return_freed_memory`), TF32, attention kernels and seed."""
    distributed, device = init_distributed(resolve_device(config.device))
    set_threads(config.threads)
    if device.type == "cpu" and fast_paths_enabled():  # MTKIT_FAST_PATHS=0: off
        if config.shard == "fsdp":
            return_freed_memory()  # what the shards save is not kept in the heap's holes
        else:
            retain_freed_memory()  # no page faults for each update's re-allocated tensors
    enable_tf32(device)
    avoid_per_shape_attention_plans(device, cudnn=config.cudnn_attention == "true")
    seed_everything(config.seed)
    return distributed, device


def build_optimizer(
    model: torch.nn.Module, config: TrainConfig, *, device: torch.device, elapsed: Callable[[], float] = lambda: 0.0
) -> tuple[torch.optim.Optimizer | MasterWeightOptimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam, fused where torch has the kernel (on the CPU from torch 2.4: one kernel instead of a walk
    over the parameter tensors; docs/performance.md), and its learning-rate schedule (`elapsed()`:
    seconds trained, for time-based decay)."""
    fused = device.type == "cuda" or (device.type == "cpu" and _FUSED_ADAM_ON_CPU)
    adam = partial(torch.optim.Adam, lr=config.lr, betas=(0.9, 0.98), eps=1e-9, fused=fused)
    if bf16_weights_on(config):  # the model's weights are bf16: Adam updates fp32 masters of them
        master = MasterWeightOptimizer(model, adam)
        return master, torch.optim.lr_scheduler.LambdaLR(master.optimizer, schedule_factor(config, elapsed))
    optimizer = adam(p for p in model.parameters() if p.requires_grad) if config.lora else adam(model.parameters())
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_factor(config, elapsed))


def training_forward(
    model: EncoderDecoder, config: TrainConfig, *, distributed: Distributed, device: torch.device, levers: Levers
) -> torch.nn.Module:
    """The module the training step calls for a batch's summed loss (`TeacherForcing`, or with
    `train.fused_loss` `FusedTeacherForcing`), wrapped in DDP under torchrun (or sharded with FSDP:
    `train.shard`), and torch.compile'd with the levers' `compile`.

    DDP and FSDP average gradients over ranks; `Trainer.update` scales the loss so the result equals one
    process over the combined batch. Only this forward and loss are compiled (with dynamic shapes,
    so token-budget batches do not each compile): validation and decoding stay eager.
    """
    amp_dtype = autocast_dtype(device, config.precision)
    if config.checkpoint_activations:
        recompute_blocks(model)
    forward: torch.nn.Module = (
        FusedTeacherForcing(model, config.label_smoothing, amp_dtype=amp_dtype)
        if fused_loss_on(config, device)
        else TeacherForcing(model, config.label_smoothing, amp_dtype=amp_dtype, fused=levers.compile)
    )
    if config.shard == "fsdp":
        forward = shard_training(forward, model, amp_dtype=amp_dtype)
    elif distributed.enabled:
        device_ids = [device.index] if device.type == "cuda" else None
        forward = torch.nn.parallel.DistributedDataParallel(forward, device_ids=device_ids)
    mode = "reduce-overhead" if levers.graphs else None  # CUDA graphs, recorded per batch shape
    if levers.compile:  # its CPU kernels cached by the vector width they were generated for
        key_compiled_cpu_code_by_vector_width()
    if levers.compile and levers.by_layer:  # the layers compiled in place; DDP's hooks stay outside them
        compile_by_layer(forward, model, mode=mode)
    elif levers.compile:  # compiled on the first update
        forward = torch.compile(forward, dynamic=True, mode=mode)
    return forward


class LossWindow:
    """Training loss and target tokens since the last log line."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.loss = torch.zeros((), device=self.device)  # summed on the device: no host sync an update
        self.tokens: torch.Tensor | int = 0
        self.start = time.monotonic()

    def add(self, loss_sum: torch.Tensor, tokens: torch.Tensor | int) -> None:
        self.loss += loss_sum
        self.tokens += tokens

    def log(self, run_dir: RunWriter | None, progress: Progress, *, lr: float, bar: tqdm) -> None:
        """Write the window's record to log.jsonl and the progress bar (with a run directory), then start a new one."""
        if run_dir is not None:
            record = self.record(progress, lr)
            bar.set_postfix(loss=f"{record['train_loss']:.3f}", lr=f"{record['lr']:.2e}", tok_s=f"{record['tokens_per_s']:.0f}")
            run_dir.append_log(record)
        self.reset()

    def record(self, progress: Progress, lr: float) -> dict[str, Any]:
        """The log.jsonl record of this window."""
        seconds, tokens = max(time.monotonic() - self.start, 1e-9), int(self.tokens)
        return {
            "step": progress.step,
            "epoch": progress.epoch + 1,
            "train_loss": round(self.loss.item() / max(tokens, 1), 4),
            "lr": lr,
            "tokens_per_s": round(tokens / seconds, 1),
        }


class Trainer:
    """The model, optimiser, schedule, data order and loop of one training.

    Built without a run directory (`run_dir=None`, as on ranks other than 0 and in the speed
    benchmark) it trains, but neither validates nor writes anything.
    """

    def __init__(
        self, config: Config, device: torch.device, *, distributed: Distributed | None = None, run_dir: RunWriter | None = None,
        metric: ValidationMetric | None = None,  # train.validate_metric's COMET model, if loaded already
    ) -> None:  # fmt: skip
        self.config, self.train_config = config, config.train
        self.device, self.distributed, self.run_dir = device, distributed or Distributed(), run_dir
        self.amp_dtype = autocast_dtype(device, self.train_config.precision)
        self.tokenizers = tokenizers = load_tokenizers(config.data_path, joint=config.tokenizer.joint)
        self.data = TrainingData(config, self.tokenizers)
        self.valid = load_prepared(config.data_path, "valid")
        check_valid_sets(config, self.valid)
        metric = metric or (ValidationMetric.load(config.train, device) if run_dir is not None else None)
        self.validate_model = partial(  # a model's loss, BLEU (and COMET) on the validation set, decoded as the recipe says
            eager(validate), valid=self.valid, tokenizers=self.tokenizers, config=config, device=device,
            amp_dtype=self.amp_dtype, metric=metric,
        )  # fmt: skip
        self.model = model = build_model(
            config.model, tokenizers.src.vocab_size, tgt_vocab_size=tokenizers.tgt.vocab_size, share_vocab=tokenizers.joint
        ).to(device, weights_dtype(self.train_config))
        self.lineage = Lineage(model, config, tokenizers=tokenizers, device=device)  # before the optimiser: LoRA's adapters
        self.trained_parameters = self.model.freeze(part.strip() for part in self.train_config.freeze.split(",") if part.strip())
        self.levers = levers = Levers.of(self.train_config, device, layered=can_compile_by_layer(model))
        self.forward_model = training_forward(model, config.train, distributed=self.distributed, device=device, levers=levers)
        self.progress = Progress(metric=self.train_config.validate_metric)
        # when the time not yet in progress.elapsed began; under torchrun, the ranks' largest clock at the last stop check
        self._clock, self._agreed_elapsed = time.monotonic(), 0.0
        self.optimizer, self.scheduler = build_optimizer(self.model, config.train, device=device, elapsed=self.schedule_clock)
        self.holder = hold_model(self.lineage, self.optimizer, distributed=self.distributed)  # whole, or sharded
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp_dtype == torch.float16)
        self.ema = WeightEMA(self.model, self.train_config.ema) if self.train_config.ema > 0 else None
        self.guard = UpdateGuard(
            model, self.optimizer, scheduler=self.scheduler, scaler=self.scaler, ema=self.ema, clip_norm=config.train.clip_norm
        )
        self.max_time = parse_duration(self.train_config.max_time)
        self.agreement = StopAgreement(self.distributed, clocked=self.max_time is not None)
        self.snapshots = pending_snapshots(self.train_config.snapshots, run_dir)  # (seconds, label) still to write
        self.stop_requested = self.diverged = False  # a signal asked to stop; too many non-finite updates in a row

    def restore(self, payload: dict[str, Any]) -> None:
        """Continue exactly from a last.pt payload: weights and optimiser (`holder`), schedule, progress, RNG, scaler, EMA."""
        self.holder.restore(payload, last=RunFiles(self.config.run_path).last)
        self.scheduler.load_state_dict(payload["scheduler"])
        self.progress = Progress.resumed(payload["progress"], self.train_config.validate_metric)
        torch.set_rng_state(payload["rng"])
        if payload.get("scaler"):
            self.scaler.load_state_dict(payload["scaler"])
        if self.ema is not None and "ema" in payload:  # else the average starts from the current weights
            self.ema.load_state_dict(payload["ema"])

    def start_from(self, payload: dict[str, Any], parent: str) -> None:
        """Fine-tuning: the parent's weights (`holder.load_parent`); the optimiser, schedule, progress and data
        position stay new, and the EMA restarts from these weights."""
        said = self.holder.load_parent(payload, parent)
        if said is not None:
            say(said, distributed=self.distributed)
        if isinstance(self.optimizer, MasterWeightOptimizer):
            self.optimizer.take_model_weights()
        if self.ema is not None:
            self.ema.restart()

    def checkpoint(self, saved: SavedWeights) -> Checkpoint:
        """Everything `--resume` needs: the model's `saved` state (`holder.save`), schedule, RNG, scaler, EMA and progress."""
        training_state = {
            **saved.record,
            "scheduler": self.scheduler.state_dict(),
            "rng": torch.get_rng_state(),
            "scaler": self.scaler.state_dict(),  # empty unless fp16
            **({"ema": self.ema.state_dict()} if self.ema is not None else {}),
        }
        ema = self.ema.weights() if self.ema is not None else None
        return Checkpoint(config=self.config, tokenizers=self.tokenizers, weights=saved.weights, ema_weights=ema,
                          progress=dataclasses.asdict(self.progress), training_state=training_state,
                          lora_parent=self.lineage.record)  # fmt: skip

    def epoch(self) -> Epoch:
        """The current epoch's ids and this rank's batches, in training order (no side effects)."""
        rank, world, max_length = self.distributed.rank, self.distributed.world_size, min(self.model.max_positions, 1_000_000)
        return self.data.epoch(self.progress.epoch, max_length, rank=rank, world_size=world, shapes=self.levers.shapes)

    def run(self) -> Progress:
        """Train until a limit, early stopping or SIGINT/SIGTERM, validating and saving on the way; returns the progress."""
        config, progress = self.train_config, self.progress
        self._clock = time.monotonic()
        bar = _progress_bar(config.max_steps, progress.step, self.distributed.is_main)
        window, last_validated = LossWindow(self.device), progress.step
        plain_lines = self.distributed.is_main and self.run_dir is not None and bar.disable  # no bar: stderr is a file
        plain = PlainProgress(enabled=plain_lines, max_time=self.max_time)
        self.model.train()  # once: validation puts back the mode it found
        with stop_signals_call(self._request_stop):
            while not self._should_stop():
                epoch = self.epoch()
                if progress.batches_done == 0:
                    log_epoch(self.run_dir, self.progress, epoch=epoch)
                ahead = BatchAhead(epoch, config.accumulate, device=self.device, levers=self.levers)
                while progress.batches_done < len(epoch.batches) and not self._should_stop():
                    group = ahead.take(progress.batches_done)
                    progress.batches_done += len(group)
                    window.add(*self.update(group, ahead.while_waiting(progress.batches_done)))
                    bar.update(1)
                    self._take_due_snapshots()
                    if plain.due():
                        self._settle()
                        plain.say(window.record(progress, self.scheduler.get_last_lr()[0]), self.elapsed())
                    if self._counted_at(config.log_every):
                        window.log(self.run_dir, progress, lr=self.scheduler.get_last_lr()[0], bar=bar)
                    if self._counted_at(config.validate_every):
                        self.validate_and_save()
                        last_validated = progress.step
                if progress.batches_done >= len(epoch.batches):
                    progress.epoch, progress.batches_done = progress.epoch + 1, 0
            self._settle()
            self._add_elapsed()
            self._take_due_snapshots()  # a validation after the last update may have run the time out
            bar.close()
            never_saved = self.run_dir is not None and not self.run_dir.files.last.is_file()
            if progress.step > last_validated or broadcast_from_main([never_saved], self.distributed)[0]:
                self.validate_and_save()
            if self.run_dir is not None:
                self.run_dir.draw_curves(final=True)
        return progress

    def _request_stop(self, signum: int, frame: Any) -> None:
        self.stop_requested = True

    def update(self, batches: list[Batch], while_waiting: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimiser update over `accumulate` batches; its summed loss and target tokens (device tensors, 0
        for a skipped update). No host sync: `while_waiting` runs once the update's work is queued, then
        the previous update's outcome is read (`_settle`; on a GPU that waits for that update only)."""
        total_tokens = tokens_over_ranks(sum(b.num_tokens for b in batches), self.device, distributed=self.distributed)
        loss_sum = torch.zeros((), device=self.device)
        for batch in batches:
            batch = batch.to(self.device)
            self.levers.begin_step()
            with record_function("mtkit.forward"):
                loss = self.forward_model(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out, src_padded=batch.src_padded)
            with record_function("mtkit.backward"):
                self.scaler.scale(loss * self.distributed.world_size / total_tokens).backward()
            loss_sum += loss.detach()
        loss_sum = sum_over_ranks(loss_sum, self.distributed)
        applied = self.guard.clip_and_check(loss_sum)
        if while_waiting is not None:
            with record_function("mtkit.data"):
                while_waiting()
        self._settle()  # before this update's step, so its learning rate follows a skipped one exactly
        with record_function("mtkit.optimizer"):
            self.guard.step(applied, loss_sum)
        self.progress.step += 1  # given back by _settle if the update turns out skipped
        if self.progress.nonfinite_in_a_row:
            self._settle()  # while updates fail, each is read at once: max_nonfinite ends the run on time
        return torch.where(applied, loss_sum, 0.0), applied * total_tokens

    def _settle(self) -> None:
        """Count the updates whose outcome the host has not read yet; `max_nonfinite` skips in a row end the run."""
        for step, scale in self.guard.settle(self.progress):  # fp16 gradient overflows
            report_overflow(self.run_dir, self.distributed, step=step, scale=scale)
        self.diverged = self.diverged or self.progress.nonfinite_in_a_row >= self.train_config.max_nonfinite

    def _counted_at(self, every: int) -> bool:
        """Whether the step is a multiple of `every`, once the last update's outcome is read (the log syncs anyway)."""
        if self.progress.step % every:
            return False
        self._settle()
        return self.progress.step % every == 0

    def elapsed(self) -> float:
        return self.progress.elapsed + time.monotonic() - self._clock

    def schedule_clock(self) -> float:
        """Seconds trained, for a time-based decay; under torchrun the ranks' largest at the last stop check (one lr for all)."""
        return self._agreed_elapsed if self.distributed.enabled else self.elapsed()

    def _add_elapsed(self) -> None:
        now = time.monotonic()
        self.progress.elapsed, self._clock = self.progress.elapsed + now - self._clock, now

    def _should_stop(self) -> bool:
        """Whether to stop; decided together, so every rank stops at the same update (and agrees on the clock).
        A limit is checked again once the last update's outcome is read: a skipped update does not reach max_steps."""
        limit = self._limit_reached()
        if limit or self.stop_requested:
            self._settle()
            limit = self._limit_reached()
        stop, self._agreed_elapsed = self.agreement.stop(self.elapsed(), limit_reached=limit, signalled=self.stop_requested)
        return stop

    def _limit_reached(self) -> bool:
        config, progress = self.train_config, self.progress
        if self.diverged or (config.max_steps and progress.step >= config.max_steps):
            return True
        if config.max_epochs and progress.epoch >= config.max_epochs:
            return True
        if self.max_time and self.elapsed() >= self.max_time:
            return True
        return bool(config.patience) and progress.bad_validations >= config.patience

    def validate_and_save(self) -> None:
        """Rank 0 validates and writes checkpoints; every rank then shares its early-stopping state."""
        self._settle()  # the step, schedule and EMA saved are exact
        self._add_elapsed()
        progress = self.progress
        saved = self.holder.save(progress.step)  # sharded: every rank writes its shards; rank 0 gets the whole weights
        if self.run_dir is not None:
            result = self.validate_model(self.holder.validating(saved))
            improved = progress.record_validation(result.bleu, result.quality_score)
            scores, elapsed = {**result.record(), **progress.best_record()}, round(progress.elapsed, 1)
            self.run_dir.append_log({"step": progress.step, "epoch": progress.epoch + 1, **scores, "elapsed_s": elapsed})
            say(validation_line(progress, result))
            self.run_dir.save(self.checkpoint(saved), best=improved and not self.diverged, keep=self.train_config.keep)
            self.run_dir.draw_curves()
        progress.take_early_stopping_state(broadcast_from_main(progress.early_stopping_state(), self.distributed))

    def _take_due_snapshots(self) -> None:
        """Write at_<time>.pt for each snapshot time training has now run (after an update)."""
        while self.snapshots and self.elapsed() >= self.snapshots[0][0]:
            self._settle()
            _, label = self.snapshots.pop(0)
            assert self.run_dir is not None  # snapshots are only pending with a run directory
            self.run_dir.snapshot(self.checkpoint(self.holder.save(self.progress.step)), label)
            say(f"snapshot after {label} of training (step {self.progress.step}): {self.run_dir.files.snapshot(label)}")

    def validate_final_weights(self) -> None:
        """At the end of training: average.pt (`train.average_last`, the mean of the last kept checkpoints)
        and ema.pt (`train.ema`), each validated and reported next to best.pt; `-m RUN` takes the best."""
        assert self.run_dir is not None  # only the run's owner validates
        count = self.train_config.average_last
        if count:
            averaged, sources = average_checkpoints(self.run_dir.path, count)
            record = {"averaged": [p.name for p in sources]}
            self._validate_weights(averaged, "average", f"average of the last {count} checkpoints", record)
        if self.ema is not None:
            ema = read_checkpoint(self.run_dir.files.ema)  # written with the final weights by the last save
            self._validate_weights(ema, "ema", f"moving average of the weights (decay {self.ema.decay:g})")

    def _validate_weights(self, payload: dict[str, Any], stem: str, what: str, record: dict[str, Any] | None = None) -> None:
        """Validate `payload`'s weights, store the BLEU (and COMET) in RUN/<stem>.pt, log them next to best.pt's
        and say which -m RUN uses."""
        assert self.run_dir is not None
        result = self.validate_model(self.holder.holding(payload["model"]))  # training is over: any model may hold them
        save_checkpoint(payload | result.weights_record(), self.run_dir.files.weights(stem))
        scores, said = final_weights_report(stem, result, progress=self.progress)
        self.run_dir.append_log({"step": self.progress.step, **(record or {}), **scores})
        chosen = resolve_checkpoint(self.run_dir.path).name
        say(f"{what}: {said}; -m RUN uses {chosen}")


def report_overflow(run_dir: RunWriter | None, distributed: Distributed, *, step: int, scale: float) -> None:
    """Say (rank 0) and log an fp16 gradient overflow: the update after `step` was skipped and the scaler
    lowered its loss scale to `scale`. Expected now and then: training goes on."""
    say(f"fp16: gradient overflow at update {step + 1}; update skipped, loss scale lowered to {scale:g}", distributed=distributed)
    if run_dir is not None:
        run_dir.append_log({"step": step, "overflow": True, "loss_scale": scale})


def log_epoch(run_dir: RunWriter | None, progress: Progress, *, epoch: Epoch) -> None:
    """Say how many pairs of each corpus an epoch draws (in log.jsonl) and how many are too long for the model;
    with `train.shapes`, its batch shapes and padding share."""
    if run_dir is None:
        return
    record = {"corpus_pairs": epoch.corpus_pairs, "skipped": epoch.skipped}
    if len(epoch.direction_pairs) > 1:
        record["direction_pairs"] = epoch.direction_pairs
        if progress.epoch == 0:
            total = sum(epoch.direction_pairs.values())
            table = ", ".join(f"{way} {count:,} ({count / total:.1%})" for way, count in epoch.direction_pairs.items())
            say(f"pairs drawn per epoch by direction: {table}")
    if epoch.shapes:  # train.shapes: the lengths are the buckets'
        record |= {"shapes": epoch.shapes, "padding": round(epoch.padding, 4)}
        if progress.epoch == 0:
            say(f"batches in {epoch.shapes} shapes (train.shapes): {epoch.padding:.1%} of their positions are padding")
    run_dir.append_log({"step": progress.step, "epoch": progress.epoch + 1, **record})
    if epoch.skipped:
        say(f"epoch {progress.epoch + 1}: skipped {epoch.skipped} pairs longer than the model's maximum length")


class PlainProgress:
    """When the progress bar is off (stderr is a file or a CI log), a plain progress line at least once a minute."""

    def __init__(self, *, enabled: bool, max_time: float | None = None, every: float = 60.0) -> None:
        self.enabled, self.max_time, self.every = enabled, max_time, every
        self.last = time.monotonic()

    def due(self) -> bool:
        return self.enabled and time.monotonic() - self.last >= self.every

    def say(self, record: dict[str, Any], elapsed: float) -> None:
        """`step N (epoch E): loss L, T tokens/s, 3.2 min elapsed[, 11.8 min left]`, and the clock restarts."""
        left = f", {max(self.max_time - elapsed, 0) / 60:.1f} min left" if self.max_time else ""
        say(
            f"step {record['step']} (epoch {record['epoch']}): loss {record['train_loss']:.3f}, "
            f"{record['tokens_per_s']:.0f} tokens/s, {elapsed / 60:.1f} min elapsed{left}"
        )
        self.last = time.monotonic()


def pending_snapshots(snapshots: str, run_dir: RunWriter | None) -> list[tuple[float, str]]:
    """(seconds, label) of each `train.snapshots` time not yet written, soonest first; none without a run dir."""
    labels = [label.strip() for label in snapshots.split(",") if label.strip()]
    if run_dir is None:
        return []
    due = [(parse_duration(label) or 0.0, label) for label in labels if not run_dir.files.snapshot(label).is_file()]
    return sorted(due)


def _progress_bar(max_steps: int, step: int, is_main: bool) -> tqdm:
    """Updates on stderr, on rank 0 and only on a terminal."""
    return tqdm(
        total=max_steps or None,
        initial=step,
        unit=" step",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=None if is_main else True,
    )


def train(config: Config, *, resume: bool = False, overwrite: bool = False) -> Progress:
    """Train the recipe's model into its run directory (`resume`: continue from last.pt; `overwrite`: start again).

    A run owns its process: `setup_process` sets torch's threads (`train.threads`), TF32 and the
    attention kernels on CUDA, and on CPU keeps freed memory (glibc's allocator, unless
    MTKIT_FAST_PATHS=0), all process-wide; SIGINT/SIGTERM stop the run while it trains, and the
    former handlers are restored after.
    """
    distributed, device = setup_process(config.train)
    check_sharding(config, distributed)
    main = distributed.is_main  # rank 0 owns the run directory
    metric = ValidationMetric.load(config.train, device) if main else None  # a wrong COMET model: one line, nothing written
    CompileCache.check_folder(config, device)  # the compiler cache is code: a folder others can write is refused first
    run_dir = (
        RunWriter(config.run_path, resume=resume, overwrite=overwrite, tensorboard=config.train.tensorboard) if main else None
    )
    barrier(distributed)
    trainer = Trainer(config, device, distributed=distributed, run_dir=run_dir, metric=metric)
    if resume:
        trainer.restore(read_checkpoint(RunFiles(config.run_path).last))
        if run_dir is not None:
            run_dir.take_up(trainer.progress)  # the log back to last.pt's step; best.pt's score if newer
    elif config.train.init_from:
        trainer.start_from(read_checkpoint(Path(config.train.init_from)), config.train.init_from)
    if run_dir is not None:
        run_dir.write_config(config)
    _start_message(trainer)
    compile_cache = CompileCache.opened(config, device, levers=trainer.levers)  # a compiled step's earlier compile, if saved
    try:
        if config.train.init_from and not resume:
            trainer.validate_and_save()  # the parent on the new validation set, as step 0
        progress = trainer.run()
        if run_dir is not None and compile_cache is not None:
            compile_cache.save()  # what this run compiled, for the next
        if run_dir is not None and not trainer.diverged:
            trainer.validate_final_weights()
    finally:
        shutdown(distributed)
        if run_dir is not None:
            run_dir.close()
    _final_message(trainer)
    return progress


def _start_message(trainer: Trainer) -> None:
    if not trainer.distributed.is_main:
        return
    distributed, amp_dtype = trainer.distributed, trainer.amp_dtype
    precision = "fp32" if amp_dtype is None else str(amp_dtype).removeprefix("torch.")
    processes = f", {distributed.world_size} processes" if distributed.enabled else ""
    processes += ", sharded (FSDP)" if trainer.train_config.shard == "fsdp" else ""
    processes += f"; {trainer.levers.describe()}" if trainer.device.type == "cuda" else ""
    start = f"resuming at step {trainer.progress.step}" if trainer.progress.step else "starting"
    parent, total = trainer.train_config.init_from, trainer.model.num_parameters()
    if parent and not trainer.progress.step:
        start = f"fine-tuning {parent} (its weights; a new optimiser, schedule and progress)"
    say(
        f"training {trainer.config.model.arch}: {total / 1e6:.1f}M parameters on "
        f"{trainer.device.type} ({precision}{processes}), {start}; run directory {trainer.config.run_path}"
    )
    if trainer.trained_parameters < total:
        lora, freeze = trainer.train_config.lora, trainer.train_config.freeze
        what = f"train.lora (rank {lora.rank}: {', '.join(lora.targets)})" if lora else f"train.freeze={freeze}"
        say(f"{what}: {trainer.trained_parameters:,} of {total:,} parameters are trained")


def _final_message(trainer: Trainer) -> None:
    """The closing line on rank 0; a diverged run ends with an error on every rank."""
    progress, run_path = trainer.progress, trainer.config.run_path
    if trainer.diverged:
        raise MtkitError(
            f"training diverged: {trainer.train_config.max_nonfinite} updates in a row had a non-finite loss or gradient "
            f"(step {progress.step}); best.pt in {run_path} is kept; lower train.lr or raise train.warmup_steps"
        )
    if not trainer.distributed.is_main:
        return
    reason = "stopped on request" if trainer.stop_requested else "finished"
    say(
        f"training {reason} at step {progress.step} (epoch {progress.epoch + 1}, {progress.elapsed / 60:.1f} min); "
        f"best valid {best_text(progress)} at step {progress.best_step}; run directory {run_path}"
    )
    if trainer.stop_requested:
        say(f"resume with: mtkit train RECIPE --resume --set run_dir={run_path}")
