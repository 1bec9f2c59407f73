"""The training loop: label-smoothed teacher forcing, Adam with warmup + inverse-sqrt decay,
token-budget batches, validation (loss and BLEU), checkpoints, early stopping and exact resume.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
import yaml
from tqdm import tqdm

from mtkit.batching import Batch, ParallelIds, token_batches
from mtkit.checkpoint import atomic_save, checkpoint_payload, read_checkpoint
from mtkit.config import Config, config_to_dict, parse_duration
from mtkit.distributed import (
    any_rank,
    barrier,
    broadcast_from_main,
    count_over_ranks,
    init_distributed,
    shutdown,
    sum_over_ranks,
)
from mtkit.ema import WeightEMA
from mtkit.errors import MtkitError
from mtkit.loss import sequence_loss
from mtkit.models import EncoderDecoder, build_model
from mtkit.prepare import load_prepared
from mtkit.runtime import autocast, autocast_dtype, resolve_device, retain_freed_memory, seed_everything, set_threads
from mtkit.tokenizer import load_tokenizers
from mtkit.translate import Translator


@dataclass
class Progress:
    """Where training stands; saved in `last.pt` so `--resume` continues exactly."""

    step: int = 0
    epoch: int = 0
    batches_done: int = 0  # batches of `epoch` already consumed
    best_bleu: float = -1.0
    best_step: int = 0
    bad_validations: int = 0
    elapsed: float = 0.0  # seconds of training before this process
    skipped_updates: int = 0  # updates skipped because the loss or gradient was not finite
    nonfinite_in_a_row: int = 0


def inverse_sqrt_schedule(warmup_steps: int) -> Callable[[int], float]:
    """Learning-rate factor for update number `completed + 1`: linear warmup to 1, then 1/sqrt decay.

    `LambdaLR` calls it with the number of updates already made, so update n uses factor(n - 1).
    """

    def factor(completed: int) -> float:
        update = completed + 1
        if update < warmup_steps:
            return update / warmup_steps
        return math.sqrt(warmup_steps / update)

    return factor


class Trainer:
    """Owns one training run: model, optimiser, data order and the run directory."""

    def __init__(self, config: Config, resume: bool = False, overwrite: bool = False) -> None:
        self.config = config
        self.train_config = config.train
        self.run_dir = config.run_path
        self.dist, self.device = init_distributed(resolve_device(self.train_config.device))
        if self.dist.is_main:  # one process owns the run directory
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._lock = lock_run_dir(self.run_dir)
            self._check_run_dir(resume, overwrite)
        barrier(self.dist)
        set_threads(self.train_config.threads)
        if self.device.type == "cpu":
            retain_freed_memory()  # no page faults for each update's re-allocated tensors
        seed_everything(self.train_config.seed)
        self.amp_dtype = autocast_dtype(self.device, self.train_config.precision)
        self.tokenizers = load_tokenizers(config.data_path, config.tokenizer.joint)
        self.train_ids = ParallelIds(load_prepared(config.data_path, "train"))
        self.valid = load_prepared(config.data_path, "valid")
        self.model: EncoderDecoder = build_model(
            config.model, self.tokenizers.src.vocab_size, self.tokenizers.tgt.vocab_size, self.tokenizers.joint
        ).to(self.device)
        # Gradients are averaged over ranks by DDP; `update` scales the loss so the result equals
        # one process over the combined batch.
        self.forward_model = self.model
        if self.dist.enabled:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.forward_model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=device_ids)
        if self.train_config.compile:  # compiled on the first update; validation, decoding and the fused loss stay eager
            self.forward_model = torch.compile(self.forward_model, dynamic=True)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(),
            lr=self.train_config.lr,
            betas=(0.9, 0.98),
            eps=1e-9,
            fused=self.device.type == "cuda",
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, inverse_sqrt_schedule(self.train_config.warmup_steps))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self.ema = WeightEMA(self.model, self.train_config.ema) if self.train_config.ema > 0 else None
        self.progress = Progress()
        self.max_time = parse_duration(self.train_config.max_time)
        self.stop_requested = False
        self.diverged = False
        if resume:
            self._restore()
        if self.dist.is_main:
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))

    def _check_run_dir(self, resume: bool, overwrite: bool) -> None:
        last = self.run_dir / "last.pt"
        if resume and not last.is_file():
            raise MtkitError(f"{self.run_dir}: nothing to resume (no last.pt); drop --resume to start a new run")
        if not resume and last.is_file():
            if not overwrite:
                raise MtkitError(
                    f"{self.run_dir} already holds a run; use --resume to continue it, "
                    "--overwrite to start again, or --set run_dir=NEW_DIR"
                )
            names = ("last.pt", "best.pt", "ema.pt", "average.pt", "log.jsonl")
            for path in [*self.run_dir.glob("step_*.pt"), *(self.run_dir / n for n in names)]:
                path.unlink(missing_ok=True)

    def _restore(self) -> None:
        payload = read_checkpoint(self.run_dir / "last.pt")
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        self.progress = Progress(**payload["progress"])
        torch.set_rng_state(payload["rng"])
        if payload.get("scaler"):
            self.scaler.load_state_dict(payload["scaler"])
        if self.ema is not None and "ema" in payload:  # else the average starts from the current weights
            self.ema.load_state_dict(payload["ema"])

    def run(self) -> Progress:
        """Train until a limit or early stopping; returns the final progress."""
        previous = signal.signal(signal.SIGINT, self._request_stop)
        previous_term = signal.signal(signal.SIGTERM, self._request_stop)
        try:
            self._start_message()
            self._loop()
        finally:
            shutdown(self.dist)
            signal.signal(signal.SIGINT, previous)
            signal.signal(signal.SIGTERM, previous_term)
        return self.progress

    def _request_stop(self, signum: int, frame: Any) -> None:
        self.stop_requested = True

    def epoch_batches(self) -> list:
        batches, skipped = token_batches(
            self.train_ids.src.lengths,
            self.train_ids.tgt.lengths,
            self.train_config.batch_tokens,
            self.train_config.seed,
            self.progress.epoch,
            min(self.model.max_positions, 1_000_000),
        )
        if skipped and self.progress.batches_done == 0 and self.dist.is_main:
            _say(f"epoch {self.progress.epoch + 1}: skipped {skipped} pairs longer than the model's maximum length")
        if self.dist.enabled:  # a disjoint, equally long share of the epoch for each rank
            usable = len(batches) // self.dist.world_size * self.dist.world_size
            batches = batches[self.dist.rank : usable : self.dist.world_size]
        return batches

    def _loop(self) -> None:
        config = self.train_config
        start_time, start_step = time.monotonic(), self.progress.step
        bar = tqdm(
            total=config.max_steps or None,
            initial=self.progress.step,
            unit=" step",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=None if self.dist.is_main else True,
        )
        window = {"loss": torch.zeros((), device=self.device), "tokens": 0, "time": time.monotonic()}
        last_validated = self.progress.step
        while not self._should_stop(start_time):
            batches = self.epoch_batches()
            while self.progress.batches_done < len(batches) and not self._should_stop(start_time):
                group = batches[self.progress.batches_done : self.progress.batches_done + config.accumulate]
                self.progress.batches_done += len(group)
                loss_sum, tokens = self.update([self.train_ids.collate(b, self.device.type == "cuda") for b in group])
                window["loss"] += loss_sum
                window["tokens"] += tokens
                bar.update(1)
                if self.progress.step % config.log_every == 0:
                    self._log_window(window, bar)
                if self.progress.step % config.validate_every == 0:
                    self.progress.elapsed += time.monotonic() - start_time
                    start_time = time.monotonic()
                    self._validate_and_save()
                    last_validated = self.progress.step
            if self.progress.batches_done >= len(batches):
                self.progress.epoch += 1
                self.progress.batches_done = 0
        self.progress.elapsed += time.monotonic() - start_time
        bar.close()
        never_saved = self.dist.is_main and not (self.run_dir / "last.pt").is_file()
        if self.progress.step > last_validated or broadcast_from_main([never_saved], self.dist)[0]:
            self._validate_and_save()
        self._final_message(start_step)

    def update(self, batches: list[Batch]) -> tuple[torch.Tensor, int]:
        """One optimiser update over `accumulate` batches; the loss is per target token."""
        self.model.train()
        total_tokens = count_over_ranks(sum(b.num_tokens for b in batches), self.dist, self.device)
        loss_sum = torch.zeros((), device=self.device)
        for batch in batches:
            batch = batch.to(self.device)
            with autocast(self.device, self.amp_dtype):
                logits = self.forward_model(batch.src, batch.src_mask, batch.tgt_in)
            loss = sequence_loss(logits, batch.tgt_out, self.train_config.label_smoothing)
            self.scaler.scale(loss * self.dist.world_size / total_tokens).backward()
            loss_sum += loss.detach()
        loss_sum = sum_over_ranks(loss_sum, self.dist)
        self.scaler.unscale_(self.optimizer)
        clip = self.train_config.clip_norm if self.train_config.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        if not bool(torch.isfinite(loss_sum) & torch.isfinite(grad_norm)):  # the one host sync per update
            return self._skip_update(bool(torch.isfinite(loss_sum)))
        self.progress.nonfinite_in_a_row = 0
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.step += 1
        return loss_sum, total_tokens

    def _skip_update(self, loss_finite: bool) -> tuple[torch.Tensor, int]:
        """Drop an update whose loss or gradient is not finite; the step and schedule do not advance.

        Under fp16 a gradient overflow with a finite loss is expected now and then: the scaler halves
        its loss scale and training goes on. Either way `max_nonfinite` skips in a row end the run.
        """
        self.optimizer.zero_grad(set_to_none=True)
        self.progress.skipped_updates += 1
        self.progress.nonfinite_in_a_row += 1
        self.diverged = self.progress.nonfinite_in_a_row >= self.train_config.max_nonfinite
        if self.scaler.is_enabled():
            self.scaler.update()  # unscale_ recorded the overflow: the scale is lowered
            if loss_finite and self.dist.is_main:
                scale = self.scaler.get_scale()
                update = self.progress.step + 1
                _say(f"fp16: gradient overflow at update {update}; update skipped, loss scale lowered to {scale:g}")
                self._append_log({"step": self.progress.step, "overflow": True, "loss_scale": scale})
        return torch.zeros((), device=self.device), 0

    def _should_stop(self, start_time: float) -> bool:
        """Whether to stop; decided together, so every rank stops at the same update."""
        return any_rank(self._limit_reached(start_time), self.dist, self.device)

    def _limit_reached(self, start_time: float) -> bool:
        config, progress = self.train_config, self.progress
        if self.stop_requested or self.diverged:
            return True
        if config.max_steps and progress.step >= config.max_steps:
            return True
        if config.max_epochs and progress.epoch >= config.max_epochs:
            return True
        if self.max_time and progress.elapsed + time.monotonic() - start_time >= self.max_time:
            return True
        return bool(config.patience) and progress.bad_validations >= config.patience

    def _log_window(self, window: dict, bar: tqdm) -> None:
        if self.dist.is_main:
            seconds = max(time.monotonic() - window["time"], 1e-9)
            loss = window["loss"].item() / max(window["tokens"], 1)
            record = {
                "step": self.progress.step,
                "epoch": self.progress.epoch + 1,
                "train_loss": round(loss, 4),
                "lr": self.scheduler.get_last_lr()[0],
                "tokens_per_s": round(window["tokens"] / seconds, 1),
            }
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{record['lr']:.2e}", tok_s=f"{record['tokens_per_s']:.0f}")
            self._append_log(record)
        window.update(loss=torch.zeros((), device=self.device), tokens=0, time=time.monotonic())

    def _validate_and_save(self) -> None:
        """Rank 0 validates and writes checkpoints; every rank then shares its early-stopping state."""
        if self.dist.is_main:
            self._validate_and_save_main()
        shared = [self.progress.best_bleu, self.progress.best_step, self.progress.bad_validations]
        self.progress.best_bleu, self.progress.best_step, self.progress.bad_validations = broadcast_from_main(shared, self.dist)

    def _validate_and_save_main(self) -> None:
        valid_loss = self._valid_loss()
        bleu = self._valid_bleu()
        progress = self.progress
        improved = bleu > progress.best_bleu
        if improved:
            progress.best_bleu, progress.best_step, progress.bad_validations = bleu, progress.step, 0
        else:
            progress.bad_validations += 1
        record = {
            "step": progress.step,
            "epoch": progress.epoch + 1,
            "valid_loss": round(valid_loss, 4),
            "valid_ppl": round(math.exp(min(valid_loss, 50)), 2),
            "valid_bleu": round(bleu, 2),
            "best_bleu": round(progress.best_bleu, 2),
            "elapsed_s": round(progress.elapsed, 1),
        }
        self._append_log(record)
        _say(
            f"step {progress.step}: valid loss {valid_loss:.3f}, BLEU {bleu:.2f} "
            f"(best {progress.best_bleu:.2f} at step {progress.best_step})"
        )
        self._save(improved)

    @torch.inference_mode()
    def _valid_loss(self) -> float:
        self.model.eval()
        ids = ParallelIds(self.valid)
        order = list(range(len(ids)))
        total, tokens = 0.0, 0
        for start in range(0, len(order), 64):
            batch = ids.collate(order[start : start + 64]).to(self.device)
            with autocast(self.device, self.amp_dtype):
                logits = self.model(batch.src, batch.src_mask, batch.tgt_in)
            total += sequence_loss(logits, batch.tgt_out, 0.0).item()
            tokens += batch.num_tokens
        return total / max(tokens, 1)

    def _valid_bleu(self) -> float:
        import sacrebleu

        decode = dataclasses.replace(self.config.decode, beam=self.train_config.valid_beam)
        translator = Translator(self.model, self.tokenizers, decode, self.config.data.normalize, self.device)
        hypotheses = translator.translate(self.valid["src"], beam=self.train_config.valid_beam)
        return sacrebleu.corpus_bleu(hypotheses, [self.valid["tgt"]]).score

    def _save(self, improved: bool) -> None:
        try:
            self._write_checkpoints(improved)
        except OSError as err:
            raise MtkitError(
                f"{self.run_dir}: could not write a checkpoint ({err.strerror or err}); the previous checkpoints are intact; "
                "free some space and continue with --resume"
            ) from None

    def _write_checkpoints(self, improved: bool) -> None:
        extra = {"progress": dataclasses.asdict(self.progress), "step": self.progress.step}
        weights = checkpoint_payload(self.config, self.tokenizers, self.model.state_dict(), **extra)
        if improved and not self.diverged:
            atomic_save(weights, self.run_dir / "best.pt")
        if self.train_config.keep > 0:
            atomic_save(weights, self.run_dir / f"step_{self.progress.step:08d}.pt")
            for old in sorted(self.run_dir.glob("step_*.pt"))[: -self.train_config.keep]:
                old.unlink()
        training_state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": torch.get_rng_state(),
            "scaler": self.scaler.state_dict(),  # empty unless fp16
        }
        if self.ema is not None:
            atomic_save(checkpoint_payload(self.config, self.tokenizers, self.ema.weights(), **extra), self.run_dir / "ema.pt")
            training_state["ema"] = self.ema.state_dict()
        atomic_save({**weights, **training_state}, self.run_dir / "last.pt")

    def _append_log(self, record: dict[str, Any]) -> None:
        with open(self.run_dir / "log.jsonl", "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")

    def _start_message(self) -> None:
        if not self.dist.is_main:
            return
        precision = "fp32" if self.amp_dtype is None else str(self.amp_dtype).removeprefix("torch.")
        processes = f", {self.dist.world_size} processes" if self.dist.enabled else ""
        start = f"resuming at step {self.progress.step}" if self.progress.step else "starting"
        _say(
            f"training {self.config.model.arch}: {self.model.num_parameters() / 1e6:.1f}M parameters on "
            f"{self.device.type} ({precision}{processes}), {start}; run directory {self.run_dir}"
        )

    def _final_message(self, start_step: int) -> None:
        progress = self.progress
        if not self.dist.is_main and not self.diverged:
            return
        if self.diverged:
            raise MtkitError(
                f"training diverged: {self.train_config.max_nonfinite} updates in a row had a non-finite loss or gradient "
                f"(step {progress.step}); best.pt in {self.run_dir} is kept; lower train.lr or raise train.warmup_steps"
            )
        reason = "stopped on request" if self.stop_requested else "finished"
        _say(
            f"training {reason} at step {progress.step} (epoch {progress.epoch + 1}, {progress.elapsed / 60:.1f} min); "
            f"best valid BLEU {progress.best_bleu:.2f} at step {progress.best_step}; run directory {self.run_dir}"
        )
        if self.stop_requested:
            _say(f"resume with: mtkit train RECIPE --resume --set run_dir={self.run_dir}")


def _say(message: str) -> None:
    """A status line on stderr that does not break the progress bar."""
    tqdm.write(message, file=sys.stderr)


def lock_run_dir(run_dir: Path) -> IO[str]:
    """Hold an exclusive lock on the run directory while training (released when the process ends)."""
    handle = open(run_dir / "train.lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise MtkitError(
            f"{run_dir}: another training is writing to this run directory; wait for it or use another run_dir"
        ) from None
    return handle


def train(config: Config, resume: bool = False, overwrite: bool = False) -> Progress:
    """Train the recipe's model into its run directory."""
    return Trainer(config, resume=resume, overwrite=overwrite).run()
