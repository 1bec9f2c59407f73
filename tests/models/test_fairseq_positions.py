"""fairseq's sinusoids (`positions: sinusoidal_fairseq`, M2M-100's and NLLB-200's): the sines then the cosines of
frequencies spread over half the dimension minus one, for positions counted from 2."""

from __future__ import annotations

import math

import pytest
import torch

from mtkit.models.layers import FairseqPositions, make_positions


@pytest.mark.parametrize("d_model", [16, 17])
def test_position_t_is_fairseqs_row_t_plus_2(d_model: int) -> None:
    table = make_positions("sinusoidal_fairseq", d_model, max_positions=8)(12, offset=3)  # grows past its 8 rows
    assert isinstance(make_positions("sinusoidal_fairseq", d_model, max_positions=8), FairseqPositions)
    half = d_model // 2
    for t in range(12):
        position = 3 + t + 2
        frequencies = [math.exp(-i * math.log(10000) / (half - 1)) for i in range(half)]
        expected = [math.sin(position * f) for f in frequencies] + [math.cos(position * f) for f in frequencies]
        expected += [0.0] * (d_model % 2)
        torch.testing.assert_close(table[t], torch.tensor(expected), rtol=0, atol=2e-6)
