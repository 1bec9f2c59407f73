"""ServeLimits' batching of 0 (`batch_lines`, `workers`): what the server chooses is what `mtkit serve --help` says."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import typer.main

from mtkit import runtime
from mtkit.cli import app
from mtkit.serving import app as serving_app
from mtkit.serving.app import batching_for
from mtkit.serving.limits import ServeLimits


def serve_help(option: str) -> str:
    params = typer.main.get_command(app).commands["serve"].params  # Typer's own copy of click
    return next(param.help for param in params if param.name == option)


def test_batching_left_at_0_is_chosen_as_serve_help_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving_app, "cpu_cores", lambda: 2)
    on_cpu = SimpleNamespace(engine=SimpleNamespace(name="pytorch", device=torch.device("cpu")))
    elsewhere = SimpleNamespace(engine=SimpleNamespace(name="ctranslate2", device=torch.device("cpu")))
    cpu, other = batching_for(on_cpu, ServeLimits()), batching_for(elsewhere, ServeLimits())
    assert f"(0: {cpu.batch_lines} on CPU, else {other.batch_lines})" in serve_help("batch_lines")
    assert f"(0: {cpu.workers} on CPU)" in serve_help("workers") and other.workers == 1
    given = batching_for(on_cpu, ServeLimits(batch_lines=3, workers=1))
    assert (given.batch_lines, given.workers) == (3, 1)


def test_the_server_loads_its_model_at_the_threads_each_worker_decodes_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast paths are measured while loading, for the thread count of that moment: the server's own."""
    monkeypatch.setattr(serving_app, "cpu_cores", lambda: 2)
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 2)
    seen: list[int] = []
    on_cpu = SimpleNamespace(engine=SimpleNamespace(name="pytorch", device=torch.device("cpu")))

    def load(*_: object, **__: object) -> SimpleNamespace:
        seen.append(torch.get_num_threads())
        return on_cpu

    class Loaded(Exception):
        pass

    def loaded(*_: object, **__: object) -> None:
        seen.append(torch.get_num_threads())
        raise Loaded

    monkeypatch.setattr(serving_app, "Translator", SimpleNamespace(load=load))
    monkeypatch.setattr(serving_app, "model_info", loaded)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(Loaded):
            serving_app.run_server([Path("run")], engine="pytorch", device="cpu", host="127.0.0.1", port=0, limits=ServeLimits())
    finally:
        torch.set_num_threads(threads)
    assert seen == [1, 1]  # two workers of one thread each, from the load on
