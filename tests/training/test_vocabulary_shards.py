"""The vocabulary's rows shared among two processes (gloo, forked from this one) give each process the loss of its
own batch and, averaged over the processes, the gradients of a plain model: tied or not, with an output bias or
not, rows split unevenly, batches of different sizes with pads; and no process ever holds a whole table or its
whole gradient, which FSDP alone gathers and reduces in each update."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mtkit.data.tokenizer import PAD_ID
from mtkit.models.transformer import Transformer
from mtkit.training.loss import TeacherForcing
from mtkit.training.sharding import shard_training

PROCESSES = 2
VOCAB = 37  # uneven over 2 processes: 19 and 18 rows
D_MODEL = 8
CASES = {"tied": {}, "untied, with a bias": {"tie_embeddings": False, "share_vocab": False, "output_bias": True}}


def build(case: str) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(VOCAB, VOCAB, layers=1, d_model=D_MODEL, heads=2, ffn_dim=16, dropout=0.0, **CASES[case])
    if model.output.bias is not None:
        torch.nn.init.normal_(model.output.bias)  # not zeros: its gradient shows in the logits
    return model


def batch(rank: int) -> tuple[torch.Tensor, ...]:
    """Rank 0 has 3 pairs of 5 tokens, rank 1 has 2 of 4: src, src_mask, tgt_in, tgt_out, with a pad in each."""
    generator = torch.Generator().manual_seed(rank)
    rows, length = (3, 5) if rank == 0 else (2, 4)
    src, tgt = (torch.randint(PAD_ID + 1, VOCAB, (rows, length), generator=generator) for _ in range(2))
    src[0, -1] = tgt[-1, -1] = PAD_ID
    return src, src.ne(PAD_ID), tgt, tgt.roll(-1, dims=1)


def plain(case: str, rank: int) -> tuple[float, dict[str, torch.Tensor]]:
    """This rank's loss and its gradient (scaled by rank + 1, an incoming gradient of its own) on a plain model."""
    model = build(case)
    loss = TeacherForcing(model, 0.1, amp_dtype=None, fused=False)(*batch(rank))
    (loss * (rank + 1)).backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


class Shapes(TorchDispatchMode):
    """The shapes of the plain tensors that the ops run under it make."""

    def __init__(self) -> None:
        super().__init__()
        self.made: set[tuple[int, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made |= {tuple(t.shape) for t in tree_leaves(out) if type(t) is torch.Tensor}
        return out


def sharded(case: str, rank: int) -> tuple[float, dict[str, torch.Tensor], dict[str, int], bool]:
    """This rank's loss, the gradients averaged over the processes (whole), each table's rows held here, and whether
    a whole table (or its whole gradient) was made in the update."""
    model = build(case)
    forward = shard_training(TeacherForcing(model, 0.1, amp_dtype=None, fused=False), model, amp_dtype=None)
    with Shapes() as shapes:
        loss = forward(*batch(rank))
        (loss * (rank + 1)).backward()
    held = {name: p.to_local().size(0) for name, p in model.named_parameters() if p.dim() == 2 and p.size(0) == VOCAB}
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, held, (VOCAB, D_MODEL) in shapes.made


def worker(rank: int, folder: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=PROCESSES)
    found = {case: (sharded(case, rank), [plain(case, other) for other in range(PROCESSES)]) for case in CASES}
    torch.save(found, Path(folder) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    folder = tmp_path_factory.mktemp("vocabulary_shards")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    mp.start_processes(worker, args=(str(folder),), nprocs=PROCESSES, start_method="fork")
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(PROCESSES)]


@pytest.mark.parametrize("case", list(CASES))
def test_each_process_gets_its_own_loss_and_the_gradients_of_a_plain_model(answers, case):
    for rank, found in enumerate(answers):
        (loss, grads, _, _), plains = found[case]
        assert loss == pytest.approx(plains[rank][0], rel=1e-6)
        for name, grad in grads.items():  # the mean over the processes, as DDP's (and FSDP's other weights')
            expected = sum(plain_grads[name] for _, plain_grads in plains) / PROCESSES
            torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6, msg=name)
        assert set(grads) == set(plains[rank][1])


@pytest.mark.parametrize("case", list(CASES))
def test_no_process_holds_a_whole_table_or_its_whole_gradient(answers, case):
    held = [found[case][0][2] for found in answers]
    assert held[0] and held[0].keys() == held[1].keys()
    for name in held[0]:
        assert [rows[name] for rows in held] == [19, 18], name
    assert [found[case][0][3] for found in answers] == [False, False]  # FSDP alone gathers them in each update
