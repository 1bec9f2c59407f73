"""The fused loss under torch.compile: equal chunks keep dynamic shapes dynamic, one graph for every batch size
(compiling takes tens of seconds, so this is not a unit test)."""

from __future__ import annotations

import torch
from helpers import LOSS_ROWS, assert_close_to_scale, fused_loss, loss_inputs, plain_loss, value_and_grads


def test_the_loss_compiles_once_for_every_batch_size():
    """Equal chunks (pad rows to fill the last) keep dynamic shapes dynamic: one graph for every N."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    hidden, weight, bias, target, _ = loss_inputs()
    compiled = torch.compile(fused_loss(5), backend=counter, dynamic=True)
    for rows in (11, 14, 10, 17, LOSS_ROWS):  # 4, 1, 0, 3 and 1 padding rows
        arguments = (hidden[:rows], weight, bias, target[:rows], 0.1)
        expected = value_and_grads(plain_loss, *arguments)
        for got, want in zip(value_and_grads(compiled, *arguments), expected, strict=True):
            assert_close_to_scale(got, want, 1e-5, f"{rows} rows")
    assert counter.frame_count == 1
