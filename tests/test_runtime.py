"""Runtime settings: choosing the autocast dtype is pure, TF32 is switched on explicitly, stop signals, and
threads per worker (what holds for a whole process is checked in child processes: tests/system/)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtkit.runtime import autocast_dtype, avoid_per_shape_attention_plans, enable_tf32


@pytest.fixture
def tf32_off():
    """TF32 flags off for the test, restored after (they hold for the whole process)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_choosing_the_autocast_dtype_changes_no_global_setting(tf32_off):
    assert autocast_dtype(torch.device("cuda"), "fp32") is None  # needs no GPU: fp32 asks nothing of CUDA
    assert autocast_dtype(torch.device("cuda"), "fp16") is torch.float16
    assert autocast_dtype(torch.device("cpu"), "bf16") is None  # CPU always computes in fp32
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


def test_tf32_is_enabled_explicitly_and_only_for_cuda(tf32_off):
    enable_tf32(torch.device("cpu"))
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    enable_tf32(torch.device("cuda"))
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


def test_cudnn_attention_is_turned_off_only_for_cuda():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        avoid_per_shape_attention_plans(torch.device("cpu"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        avoid_per_shape_attention_plans(torch.device("cuda"))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        avoid_per_shape_attention_plans(torch.device("cuda"), cudnn=True)  # train.cudnn_attention: true
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_the_private_onednn_ops_packing_uses_are_in_this_torch():
    """Packing calls two private oneDNN ops; a torch that drops or renames them fails here, loudly,
    instead of every loaded model quietly running unpacked (pack_linears falls back to plain layers)."""
    assert torch.backends.mkldnn.is_available(), "this torch has no oneDNN: pack_linears packs nothing"
    layer = nn.Linear(1024, 1024)
    packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), 64)
    x = torch.randn(5, 1024)
    product = torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, "none", [], "")
    torch.testing.assert_close(product, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_mtkit_fast_paths_takes_0_1_packed_or_plain_and_names_a_bad_value(monkeypatch):
    from mtkit.errors import MtkitError
    from mtkit.runtime import fast_paths_enabled, fast_paths_setting

    settings = [("0", False, "0"), ("1", True, "1"), ("", True, "1"), (" packed", True, "packed"), ("plain", True, "plain")]
    for value, enabled, setting in settings:
        monkeypatch.setenv("MTKIT_FAST_PATHS", value)
        assert (fast_paths_enabled(), fast_paths_setting()) == (enabled, setting)
    monkeypatch.setenv("MTKIT_FAST_PATHS", "off")
    with pytest.raises(MtkitError, match=r"MTKIT_FAST_PATHS='off': give 0 \(fast paths off\) or 1 .*, or packed or plain"):
        fast_paths_enabled()


def test_stop_signals_call_the_handler_within_the_block_and_restore_the_former_ones():
    import os
    import signal

    from mtkit.runtime import stop_signals_call

    former = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    received = []
    with stop_signals_call(lambda signum, frame: received.append(signum)):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    assert received == [signal.SIGTERM, signal.SIGINT]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == former


def test_threads_per_worker_share_the_cores(monkeypatch):
    from mtkit import runtime

    threads = torch.get_num_threads()
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 8)
    try:
        for workers, expected in ((2, 4), (3, 2), (16, 1)):
            runtime.set_threads_per_worker(workers)
            assert torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(threads)
