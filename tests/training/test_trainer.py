"""Training's parts: the schedule, the loss, the GPU levers, the optimiser, progress lines and the errors found
before training (training itself, checkpoints and resume: tests/integration/training/test_trainer.py)."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
import torch.nn.functional as F
from helpers import prepared_reverse_task

from mtkit.config import TrainConfig, config_from_dict
from mtkit.data.tokenizer import PAD_ID
from mtkit.distributed import Distributed
from mtkit.errors import MtkitError
from mtkit.models.checkpoint import read_checkpoint, save_checkpoint
from mtkit.models.rnn import RNNSeq2Seq
from mtkit.models.transformer import Transformer
from mtkit.training.levers import Levers
from mtkit.training.loss import fused_sequence_loss, sequence_loss
from mtkit.training.regional import can_compile_by_layer
from mtkit.training.schedule import schedule_factor
from mtkit.training.trainer import PlainProgress, build_optimizer, train, training_forward


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
    assert sequence_loss(logits, target, label_smoothing=smoothing).item() == pytest.approx(expected.item(), rel=1e-5)
    # Changing logits at padded positions changes nothing.
    changed = logits.clone()
    changed[1, 1:] += 100.0
    assert sequence_loss(changed, target, label_smoothing=smoothing).item() == pytest.approx(expected.item(), rel=1e-5)


def test_the_fused_loss_of_a_compiled_step_equals_the_chunked_loss_and_its_gradient():
    torch.manual_seed(3)
    logits = torch.randn(4, 9, 37, dtype=torch.float64).float()
    target = torch.randint(3, 37, (4, 9))
    target[1, 5:] = PAD_ID
    found = []
    for loss in (sequence_loss, fused_sequence_loss):
        leaf = logits.clone().requires_grad_()
        value = loss(leaf, target, label_smoothing=0.1)
        value.backward()
        found.append((value.item(), leaf.grad))
    assert found[1][0] == pytest.approx(found[0][0], rel=1e-5)
    assert torch.allclose(found[1][1], found[0][1], atol=1e-6)
    assert found[0][1][1, 5:].abs().max() == 0  # pads get no gradient


def test_a_compiled_step_keys_inductors_cache_by_the_cpu_vector_width_it_generates_for(monkeypatch):
    """Inductor's own cache key leaves out the vector width ATEN_CPU_CAPABILITY picks: an AVX-512 process ran an
    AVX2 run's cached kernels and wrote past their buffers (mtkit.runtime.key_compiled_cpu_code_by_vector_width)."""
    from itertools import combinations

    from torch._inductor import config as inductor_config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    model = Transformer(30, 30, layers=1, d_model=16, heads=2, ffn_dim=32)
    levers = Levers(compile=True, length_multiple=1, prefetch=False)
    widths, keys = {}, {}
    for capability in ("default", "avx2", None):  # None: this CPU's own
        monkeypatch.setattr(inductor_config.cpp, "simdlen", None)  # torch's default, restored after
        monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
        if capability:
            monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
        widths[capability] = pick_vec_isa().bit_width()
        training_forward(model, TrainConfig(compile="true"), distributed=Distributed(), device=torch.device("cpu"), levers=levers)
        assert pick_vec_isa().bit_width() == widths[capability]  # the same kernels as unpinned
        keys[capability] = inductor_config.save_config_portable(ignore_private_configs=False)  # in the cache key
    for one, other in combinations(widths, 2):
        assert (keys[one] == keys[other]) == (widths[one] == widths[other]), (one, other, widths)


OFF = {"compile": "false", "length_multiple": 1, "prefetch": "false"}
ON_16 = {"compile": "true", "length_multiple": 16, "prefetch": "true"}


@pytest.mark.parametrize(
    "device, keys, expected",
    [
        ("cpu", {}, Levers(compile=False, length_multiple=1, prefetch=False)),
        ("cuda", {}, Levers(compile=True, by_layer=True, length_multiple=1, prefetch=True)),
        ("cuda", OFF, Levers(compile=False, length_multiple=1, prefetch=False)),
        ("cpu", ON_16, Levers(compile=True, length_multiple=16, prefetch=True)),
        ("cuda", {"max_time": "29m"}, Levers(compile=False, length_multiple=1, prefetch=True)),
        ("cuda", {"max_time": "30m"}, Levers(compile=True, by_layer=True, length_multiple=1, prefetch=True)),
        ("cuda", {"max_time": "5m", "compile": "true"}, Levers(compile=True, length_multiple=1, prefetch=True)),
        ("cpu", {"compile": "layers"}, Levers(compile=True, by_layer=True, length_multiple=1, prefetch=False)),
    ],
)
def test_the_gpu_levers_are_on_with_cuda_by_default_and_each_can_be_set(device, keys, expected):
    assert Levers.of(TrainConfig(**keys), torch.device(device)) == expected


def test_compile_auto_compiles_the_whole_step_of_a_model_with_no_repeated_layers():
    levers = Levers.of(TrainConfig(), torch.device("cuda"), layered=False)
    assert levers.compile and not levers.by_layer
    assert Levers.of(TrainConfig(compile="layers"), torch.device("cuda"), layered=False).by_layer  # refused later, in one line


def test_only_a_model_with_repeated_layers_compiles_by_layer():
    assert can_compile_by_layer(Transformer(30, 30, layers=1, d_model=16, heads=2, ffn_dim=32))
    assert not can_compile_by_layer(RNNSeq2Seq(30, 30, layers=1, hidden_size=16, embed_dim=8))


def test_the_lever_keys_take_yaml_true_and_false_and_refuse_other_words():
    config = config_from_dict({"train": {"compile": True, "prefetch": False, "length_multiple": 8}})
    assert (config.train.compile, config.train.prefetch, config.train.length_multiple) == ("true", "false", 8)
    with pytest.raises(MtkitError, match="'train.compile' is 'yes'; choose one of auto, true, false"):
        config_from_dict({"train": {"compile": "yes"}})


def test_resume_without_a_run_is_a_clear_error(tmp_path):
    config = prepared_reverse_task(tmp_path, max_steps=1)
    with pytest.raises(MtkitError, match="nothing to resume"):
        train(config, resume=True)


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


def test_average_last_needs_the_checkpoints_it_averages():
    from mtkit.config import config_from_dict

    with pytest.raises(MtkitError, match="give train.keep >= train.average_last"):
        config_from_dict({"train": {"average_last": 3, "keep": 2}})


def test_adam_is_fused_on_cpu_and_takes_the_same_step_as_the_loop():
    """The trainer's CPU Adam uses torch's fused kernel (torch 2.4+) and updates as the per-tensor loop does."""
    torch.manual_seed(0)
    fused_model, loop_model = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    loop_model.load_state_dict(fused_model.state_dict())
    start = fused_model.weight.detach().clone()
    config = TrainConfig(lr=1e-2, warmup_steps=1)
    optimizer, _ = build_optimizer(fused_model, config, device=torch.device("cpu"))
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
    plain = PlainProgress(enabled=True, max_time=900.0)
    clock["now"] += 59.0
    assert not plain.due()
    clock["now"] += 1.0
    assert plain.due()
    record = {"step": 800, "epoch": 2, "train_loss": 3.21, "tokens_per_s": 1510.4}
    plain.say(record, elapsed=180.0)
    assert capsys.readouterr().err == "step 800 (epoch 2): loss 3.210, 1510 tokens/s, 3.0 min elapsed, 12.0 min left\n"
    assert not plain.due()  # the minute starts again
    assert not PlainProgress(enabled=False).due()
