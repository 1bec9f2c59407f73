"""`train.bf16_weights`: a bf16 model whose optimiser updates fp32 master weights trains like the fp32
model (within a bf16 forward's rounding), checkpoints fp32 weights and resumes exactly."""

from __future__ import annotations

import pytest
import torch
from helpers import small_transformer

from mtkit.config import TrainConfig
from mtkit.errors import MtkitError
from mtkit.training.batches import collate
from mtkit.training.loss import TeacherForcing
from mtkit.training.master_weights import MasterWeightOptimizer, bf16_weights_on, full_precision_weights, weights_dtype
from mtkit.training.trainer import build_optimizer

BF16_LOSS_TOLERANCE = 2e-2  # relative: the bf16 forward rounds activations to 8 bits of mantissa
BATCH = collate([[5, 6, 7, 8], [9, 10, 11], [12, 13]], [[5, 6, 7], [8, 9], [10, 11, 12, 13]])


def model_and_optimizer(bf16: bool):
    config = TrainConfig(lr=1e-3, warmup_steps=1, bf16_weights="true" if bf16 else "false")
    model = small_transformer(dropout=0.0).train().to(dtype=weights_dtype(config))
    optimizer, _ = build_optimizer(model, config, device=torch.device("cpu"))
    return model, optimizer


def train(model, optimizer, updates: int) -> list[float]:
    forward, losses = TeacherForcing(model, 0.1, amp_dtype=None, fused=False), []
    for _ in range(updates):
        loss = forward(BATCH.src, BATCH.src_mask, BATCH.tgt_in, BATCH.tgt_out, src_padded=BATCH.src_padded)
        (loss / BATCH.num_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item() / BATCH.num_tokens)
    return losses


def test_bf16_weights_train_like_fp32_weights():
    fp32_losses = train(*model_and_optimizer(bf16=False), updates=4)
    model, optimizer = model_and_optimizer(bf16=True)
    bf16_losses = train(model, optimizer, updates=4)
    assert bf16_losses == pytest.approx(fp32_losses, rel=BF16_LOSS_TOLERANCE)
    assert bf16_losses[-1] < bf16_losses[0]  # the updates reach the bf16 weights
    assert isinstance(optimizer, MasterWeightOptimizer)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(m.dtype == torch.float32 for m in optimizer.masters)
    assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(model.parameters(), optimizer.masters, strict=True))


def test_checkpoint_holds_fp32_weights_that_load_into_an_fp32_model():
    model, optimizer = model_and_optimizer(bf16=True)
    train(model, optimizer, updates=2)
    weights = full_precision_weights(model, optimizer)
    assert all(value.dtype == torch.float32 for value in weights.values() if value.is_floating_point())
    output_master = optimizer.master_of[id(model.output.weight)]
    assert torch.equal(weights["output.weight"], output_master) and output_master.dtype == torch.float32
    decoder = small_transformer()
    decoder.load_state_dict(weights)  # a saved model decodes in fp32
    assert next(decoder.parameters()).dtype == torch.float32
    plain = small_transformer()
    assert full_precision_weights(plain, torch.optim.Adam(plain.parameters())).keys() == weights.keys()


def test_resume_is_exact():
    straight_model, straight_optimizer = model_and_optimizer(bf16=True)
    straight = train(straight_model, straight_optimizer, updates=3)
    model, optimizer = model_and_optimizer(bf16=True)
    train(model, optimizer, updates=2)
    saved_weights, saved_state = full_precision_weights(model, optimizer), optimizer.state_dict()
    resumed_model, resumed_optimizer = model_and_optimizer(bf16=True)
    resumed_model.load_state_dict(saved_weights)
    resumed_optimizer.load_state_dict(saved_state)
    assert train(resumed_model, resumed_optimizer, updates=1) == [straight[-1]]
    for expected, got in zip(straight_optimizer.masters, resumed_optimizer.masters, strict=True):
        assert got.dtype == torch.float32 and torch.equal(expected, got)


def test_the_key_and_its_limits():
    assert not bf16_weights_on(TrainConfig())  # auto: off until measured
    assert bf16_weights_on(TrainConfig(bf16_weights="true", precision="bf16"))
    with pytest.raises(MtkitError, match="train.bf16_weights"):
        bf16_weights_on(TrainConfig(bf16_weights="true", precision="fp16"))
    model, optimizer = model_and_optimizer(bf16=True)
    with pytest.raises(MtkitError, match="master weights"):
        optimizer.load_state_dict(torch.optim.Adam(small_transformer().parameters()).state_dict())
