"""An import folder's files as untrusted input, without transformers: a safetensors file that asks for more memory
than it holds, weights that would run code, special files standing in as JSON, JSON too big or too deep, sharded
weights, and a vocab_size of 10^12: each one line naming the file (and the key), before anything is sized from it."""

from __future__ import annotations

import json
import os
import resource
import signal
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import mtkit.importers.loader as loader
from mtkit.errors import MtkitError
from mtkit.importers import import_model
from mtkit.importers.loader import open_weights, read_json


def _one_line(raised: pytest.ExceptionInfo[MtkitError], *named: str) -> str:
    message = str(raised.value)
    assert "\n" not in message and all(part in message for part in named), message
    return message


def _overlapping(path: Path, names: int, size: int) -> None:
    """The review's bomb: `names` tensors over one range of `size` bytes (a file of about `size` bytes)."""
    header = {f"t{i}": {"dtype": "F32", "shape": [size // 4], "data_offsets": [0, size]} for i in range(names)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(size))


def _peak_growth_mb(read: Callable[[], object]) -> tuple[str, int]:
    """`read()` in a forked child (its peak resident memory starts at this process's current one): what it raised
    or returned, in a line, and how many MB its peak grew while reading."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            try:
                said = f"returned {read()!r}"
            except MtkitError as err:
                said = str(err)
            grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
            os.write(writer, json.dumps([said, grown]).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as answer:
        said, grown = json.loads(answer.read())
    os.waitpid(child, 0)
    return said, grown


def test_overlapping_ranges_are_refused_in_one_line_without_the_memory_they_ask_for(tmp_path: Path) -> None:
    """200 names over one 8 MiB range asked 1.6 GB of mtkit's own reader: reading it now grows the process's peak by
    less than 200 MB, and says why in one line."""
    _overlapping(tmp_path / "model.safetensors", 200, 8 << 20)
    said, grown_mb = _peak_growth_mb(lambda: dict(open_weights(tmp_path)))
    assert said.startswith(f"{tmp_path / 'model.safetensors'}: not a readable safetensors file") and "offset" in said
    assert "\n" not in said and grown_mb < 200


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\x02\0\0\0\0\0\0\0[]", "invalid JSON in header"),  # JSON, but not an object
        (struct.pack("<Q", 2**40) + b"{}", "header too large"),
        (struct.pack("<Q", 64) + b"{}", "header"),  # a header size past the end of the file
        (b"\x01", "header"),
    ],
)
def test_a_malformed_safetensors_file_is_one_line(tmp_path: Path, content: bytes, said: str) -> None:
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(MtkitError) as raised:
        open_weights(tmp_path)
    _one_line(raised, "model.safetensors: not a readable safetensors file", said)


def test_half_precision_weights_are_read_as_float32_one_tensor_at_a_time(tmp_path: Path) -> None:
    tensors = {"model.shared.weight": torch.randn(6, 4).half(), "lm_head.weight": torch.randn(6, 4).bfloat16()}
    save_file(tensors | {"model.ids": torch.arange(3)}, tmp_path / "model.safetensors")
    weights = open_weights(tmp_path)
    assert sorted(weights) == ["lm_head.weight", "shared.weight"]  # "model." dropped, integer tensors left out
    assert weights.shape("shared.weight") == (6, 4) and weights.shape("ids") is None
    assert weights["shared.weight"].dtype == torch.float32
    assert torch.equal(weights["shared.weight"], tensors["model.shared.weight"].float())
    assert torch.equal(weights["lm_head.weight"], tensors["lm_head.weight"].float())


class _Payload:
    """Unpickling it would call open(path, "w"): a file appears if the reader runs code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.path), "w")


def test_weights_that_would_run_code_are_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    torch.save({"shared.weight": torch.ones(2, 2), "x": _Payload(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(MtkitError) as raised:
        open_weights(tmp_path)
    _one_line(raised, "pytorch_model.bin: refused: reading it would unpickle io.open")
    assert not marker.exists()


@pytest.mark.parametrize("saved", [[torch.ones(2)], {"shared.weight": torch.ones(2), "step": 1}, {1: torch.ones(2)}])
def test_weights_that_are_not_a_state_dict_of_tensors_are_one_line(tmp_path: Path, saved: object) -> None:
    torch.save(saved, tmp_path / "pytorch_model.bin")
    with pytest.raises(MtkitError) as raised:
        open_weights(tmp_path)
    _one_line(raised, "pytorch_model.bin: holds", "expected a state dict")


def test_sharded_weights_are_refused_by_name(tmp_path: Path) -> None:
    save_file({"model.shared.weight": torch.ones(2, 2)}, tmp_path / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {"model.shared.weight": "model-00001-of-00001.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    with pytest.raises(MtkitError) as raised:
        open_weights(tmp_path)
    _one_line(raised, str(tmp_path), "sharded weights are not supported", "model.safetensors.index.json")


@pytest.fixture
def alarm() -> object:
    """A read that blocks (a FIFO) fails the test after 10 s instead of hanging it."""

    def expired(*_: object) -> None:
        raise TimeoutError("the read blocked")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_a_fifo_or_a_device_as_a_json_file_is_refused_before_it_is_read(tmp_path: Path, alarm: object) -> None:
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(MtkitError) as raised:
        read_json(tmp_path / "config.json", None)
    _one_line(raised, "config.json: not a regular file")
    (tmp_path / "vocab.json").symlink_to("/dev/zero")
    with pytest.raises(MtkitError) as raised:
        read_json(tmp_path / "vocab.json", None)
    _one_line(raised, "vocab.json: not a regular file")


def test_the_hub_caches_links_into_its_blobs_are_read(tmp_path: Path) -> None:
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "0123abcd").write_text('{"model_type": "marian"}', encoding="utf-8")
    snapshot = tmp_path / "snapshots" / "c0ffee"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to("../../blobs/0123abcd")
    assert read_json(snapshot / "config.json", None) == {"model_type": "marian"}


def test_json_too_large_or_too_deep_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "deep.json").write_text('{"a": ' * 100_000 + "1" + "}" * 100_000, encoding="utf-8")
    with pytest.raises(MtkitError) as raised:
        read_json(tmp_path / "deep.json", None)
    _one_line(raised, "deep.json: nested too deeply")
    monkeypatch.setattr(loader, "JSON_BYTES", 1 << 20)
    (tmp_path / "large.json").write_text(json.dumps({"pieces": "x" * (1 << 20)}), encoding="utf-8")
    with pytest.raises(MtkitError) as raised:
        read_json(tmp_path / "large.json", None)
    _one_line(raised, "large.json: larger than 1 MB")


def _m2m100_folder(folder: Path, **changes: object) -> Path:
    """A folder of M2M-100's layout, no SentencePiece model: config.json, the weights' embedding, vocab.json."""
    folder.mkdir()
    settings = {"model_type": "m2m_100", "vocab_size": 22, "d_model": 16, "encoder_layers": 1, "decoder_layers": 1}
    settings |= {"encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 8, "decoder_ffn_dim": 8}
    (folder / "config.json").write_text(json.dumps(settings | changes), encoding="utf-8")
    save_file({"model.shared.weight": torch.zeros(22, 16)}, folder / "model.safetensors")
    vocab = {piece: index for index, piece in enumerate(["<s>", "<pad>", "</s>", "<unk>", "▁a", "▁dog"])}
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"language_codes": "wmt21"}), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"vocab_size": 10**12}, "config.json: vocab_size 1000000000000, but the weights' shared.weight has shape [22, 16]"),
        ({"vocab_size": "x"}, 'config.json: vocab_size is "x"; give a whole number'),
        ({"vocab_size": None}, "config.json: vocab_size is missing"),
        ({"d_model": float("inf")}, "config.json: d_model is Infinity; give a whole number"),
        ({"encoder_attention_heads": 0, "decoder_attention_heads": 0}, "config.json: encoder_attention_heads 0 is outside"),
        ({"encoder_layers": -1}, "config.json: encoder_layers -1 is outside [1, 1024]"),
        ({"max_position_embeddings": 10**8}, "config.json: max_position_embeddings 100000000 is outside [2, 65536]"),
    ],
)
def test_sizes_are_checked_before_anything_is_sized_from_them(tmp_path: Path, changes: dict, said: str) -> None:
    """vocab_size 10^12 built a list of 10^12 filler pieces; each is now one line naming the key before any allocation."""
    folder = _m2m100_folder(tmp_path / "model", **changes)
    with pytest.raises(MtkitError) as raised:
        import_model(str(folder), tmp_path / "run")
    _one_line(raised, said)
    assert not (tmp_path / "run").exists()
