"""`train.compile: layers` (mtkit.training.regional): each layer compiled on its own computes the loss and
gradients of the eager step, traces one layer of each kind however many there are, keeps the checkpoint's
names, and leaves validation eager.

The compiler's "aot_eager" backend is used: the graphs and the autograd that inductor would receive,
without its code generation (minutes on this CPU); inductor's kernels are torch's to prove.
"""

from __future__ import annotations

import pytest
import torch

from mtkit.config import TrainConfig
from mtkit.data.tokenizer import PAD_ID
from mtkit.errors import MtkitError
from mtkit.models.rnn import RNNSeq2Seq
from mtkit.models.transformer import Transformer
from mtkit.training.levers import Levers
from mtkit.training.loss import TeacherForcing
from mtkit.training.regional import compile_by_layer, eager


class CountingBackend:
    """A torch.compile backend that counts the graphs it is given and runs them as traced (aot_eager)."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph: torch.fx.GraphModule, inputs: list) -> object:
        self.graphs += 1
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend("aot_eager")(graph, inputs)


def batch(rows: int, src_len: int, tgt_len: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 40, (rows, src_len), generator=generator)
    tgt = torch.randint(3, 40, (rows, tgt_len + 1), generator=generator)
    src[0, src_len // 2 :], tgt[-1, tgt_len // 2 :] = PAD_ID, PAD_ID
    return src, src.ne(PAD_ID), tgt[:, :-1], tgt[:, 1:]


SHAPES = [(4, 7, 6), (3, 11, 9), (5, 5, 8)]  # (rows, source length, target length)


def compiled_step(layers: int) -> tuple[TeacherForcing, CountingBackend]:
    """A `layers`+`layers` model's step compiled by layer, run once on each of SHAPES (so compiled for them)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Transformer(40, 40, layers=layers, d_model=32, heads=4, ffn_dim=64, dropout=0.0, output_bias=True)
    step, backend = TeacherForcing(model, 0.1, amp_dtype=None, fused=True), CountingBackend()
    compile_by_layer(step, model, backend=backend)
    for index, shape in enumerate(SHAPES):
        step(*batch(*shape, seed=index)).backward()
    step.model.zero_grad()
    return step, backend


@pytest.fixture(scope="module")
def steps() -> tuple[TeacherForcing, TeacherForcing, CountingBackend]:
    layered, backend = compiled_step(layers=3)
    model = Transformer(40, 40, layers=3, d_model=32, heads=4, ffn_dim=64, dropout=0.0, output_bias=True)
    plain = TeacherForcing(model, 0.1, amp_dtype=None, fused=True)
    plain.model.load_state_dict(layered.model.state_dict())
    return plain, layered, backend


@pytest.mark.parametrize(("rows", "src_len", "tgt_len"), SHAPES)
def test_the_loss_and_every_gradient_are_the_eager_steps(steps, rows, src_len, tgt_len):
    plain, layered, _ = steps
    inputs = batch(rows, src_len, tgt_len, seed=rows)
    results = []
    for step in (plain, layered):
        step.model.zero_grad()
        loss = step(*inputs)
        loss.backward()
        results.append((loss.detach(), {name: p.grad.clone() for name, p in step.model.named_parameters()}))
    (loss, grads), (layered_loss, layered_grads) = results
    assert layered_loss.item() == pytest.approx(loss.item(), rel=1e-6)
    assert grads.keys() == layered_grads.keys()
    for name, grad in grads.items():
        assert (layered_grads[name] - grad).abs().max() <= 1e-5 * grad.abs().max(), name


def test_one_layer_of_each_kind_is_traced_however_many_there_are(steps):
    three = steps[2].graphs
    one = compiled_step(layers=1)[1].graphs
    assert one == three, (one, three)
    assert three <= 6  # encoder layer, decoder layer, loss: each at most twice (its scalars symbolic, then not)


def test_the_checkpoint_names_are_unchanged_and_validation_stays_eager(steps):
    plain, layered, backend = steps
    assert list(layered.model.state_dict()) == list(plain.model.state_dict())
    before = backend.graphs
    layered.model.eval()
    with torch.no_grad():
        eager(layered.model)(*batch(2, 6, 5, seed=3)[:3])  # eval mode, other shapes: nothing compiles
    layered.model.train()
    assert backend.graphs == before


def test_a_model_without_layers_is_refused_in_one_line():
    model = RNNSeq2Seq(30, 30, layers=1, hidden_size=16, embed_dim=8, attention="luong_general", input_feed=True)
    with pytest.raises(MtkitError, match="train.compile=layers: a RNNSeq2Seq model has no repeated layers") as err:
        compile_by_layer(TeacherForcing(model, 0.1, amp_dtype=None, fused=True), model, backend="aot_eager")
    assert "\n" not in str(err.value)


def test_the_recipe_value_compiles_by_layer():
    levers = Levers.of(TrainConfig(compile="layers"), torch.device("cpu"))
    assert levers.compile and levers.by_layer
    assert "layer by layer" in levers.describe()
    assert not Levers.of(TrainConfig(compile="true"), torch.device("cpu")).by_layer
