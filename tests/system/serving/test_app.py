"""`mtkit serve` over real HTTP on loopback: round trips, dynamic batching, limits, failures, keys, SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import free_port, request, reverse, serving, translate

from mtkit.decoding.engine import PyTorchEngine, SourceBatch, output_cap
from mtkit.decoding.options import Decoding
from mtkit.decoding.search import SearchOptions
from mtkit.decoding.translator import Translator
from mtkit.serving.app import ServeLimits, model_info

REPO = Path(__file__).resolve().parents[3]


class SlowSteps:
    """A model whose every decoding step takes `delay` seconds, counting the steps."""

    def __init__(self, model, delay: float) -> None:
        self.model, self.delay, self.steps = model, delay, 0

    def decode(self, *arguments, **options):
        time.sleep(self.delay)
        self.steps += 1
        return self.model.decode(*arguments, **options)

    def __getattr__(self, name: str):
        return getattr(self.model, name)


def slow_steps(translator: Translator, delay: float) -> tuple[Translator, SlowSteps]:
    engine = PyTorchEngine(translator.engine.model)
    engine.model = SlowSteps(engine.model, delay)
    return Translator(engine, translator.tokenizers, decode=translator.decode, normalize=translator.normalize), engine.model


class SlowEngine:
    """The real engine, each search slowed down and recorded (what was translated, and when)."""

    def __init__(self, engine, delay: float) -> None:
        self.engine, self.delay, self.searched = engine, delay, []
        self.name, self.capabilities, self.alternative = engine.name, engine.capabilities, engine.alternative
        self.max_positions = engine.max_positions

    def search(self, batch: SourceBatch, options: SearchOptions):
        time.sleep(self.delay)
        self.searched.append(len(batch.sources))
        return self.engine.search(batch, options)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)


@pytest.fixture(scope="module")
def server(reverse_pytorch):
    with serving(reverse_pytorch, ServeLimits(max_lines=8, max_chars=400, max_wait_ms=20)) as (port, app):
        yield port, app


@pytest.fixture(scope="module")
def sources(reverse_run) -> list[str]:
    return (reverse_run.data_path.parent / "raw/valid.src").read_text().splitlines()


def test_a_round_trip_translates_in_order(server, sources):
    port, _ = server
    reply = translate(port, [sources[0], "", sources[1]])
    assert reply.status == 200
    assert reply.body["translations"] == [reverse(sources[0]), "", reverse(sources[1])]
    assert request(port, "GET", "/health").body == {"status": "ready"}
    assert "<textarea" in request(port, "GET", "/").body["html"]
    assert request(port, "GET", "/docs").status == 200


def test_options_reach_the_engine(server, sources):
    port, _ = server
    nbest = translate(port, [sources[2]], beam=3, nbest=2).body["translations"][0]
    assert len(nbest) == 2 and nbest[0]["text"] == reverse(sources[2]) and nbest[0]["score"] >= nbest[1]["score"]
    prefixed = translate(port, [sources[3]], prefix=["k"]).body["translations"][0]
    assert prefixed.startswith("k")
    aligned = translate(port, [sources[4]], alignments=True).body["translations"][0]
    assert aligned["text"] == reverse(sources[4]) and all(len(pair) == 2 for pair in aligned["alignment"])
    samples = [translate(port, [sources[5]], sampling="topk:3", temperature=2.0, seed=4).body for _ in range(2)]
    assert samples[0] == samples[1]
    termed = translate(port, ["a b c", "e f g"], beam=3, constraints=[["l"], []], constraints_order="given").body
    assert "l" in termed["translations"][0].split() and termed["translations"][1] == "g f e" and termed["unmet"] == [[], []]


@pytest.mark.slow
def test_a_hundred_concurrent_requests_are_answered_correctly_and_batched(server, sources):
    port, app = server
    requests = [sources[n % 40 : n % 40 + 1 + n % 3] for n in range(100)]
    before = app.state.batcher.batches
    with ThreadPoolExecutor(100) as pool:
        replies = list(pool.map(lambda lines: translate(port, lines), requests))
    assert all(reply.status == 200 for reply in replies)
    for lines, reply in zip(requests, replies, strict=True):
        assert reply.body["translations"] == [reverse(line) for line in lines]
    assert app.state.batcher.batches - before < 50  # requests were merged into shared batches


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"text": ["a"] * 9}, 413, "9 sentences in one request; the limit is 8"),
        ({"text": ["a b " * 60, "c d " * 60]}, 413, "the limit is 400"),
        (b"{not json", 422, "JSON"),
        ({"text": "a b c"}, 422, "text: Input should be a valid list"),
        ({"text": ["a"], "beam": 0}, 422, "beam:"),
        ({"text": ["a"], "sampling": "top"}, 400, "sampling top: give topk:K"),
        ({"text": ["a", "b"], "prefix": ["c"]}, 400, "1 prefixes for 2 sentences"),
        ({"text": ["a \ud800"]}, 400, "not valid Unicode"),
        ({"text": ["a"], "beam": 3, "sampling": "full"}, 400, "beam 3 with sampling"),
        ({"text": ["a"], "beem": 5}, 422, "'beem' is not a field of the request; did you mean 'beam'?"),
        (b'{"text": ["a"], "temperature": Infinity}', 422, "temperature: Input should be a finite number"),
        (
            {"text": ["a"], "sampling": "full", "temperature": 1e-300},
            422,
            "temperature: Input should be greater than or equal to 0.01",
        ),
        (
            {"text": ["a"], "sampling": "full", "temperature": 1e308},
            422,
            "temperature: Input should be less than or equal to 100",
        ),
        ({"text": ["a"], "src_lang": "zz"}, 400, "src_lang zz: this model has no language codes"),
        ({"text": ["a"], "length_penalty": float("nan")}, 422, "length_penalty: Input should be a finite number"),
        ({"text": ["a"], "sampling": "topk:5", "seed": 2**70}, 422, "seed: Input should be less than or equal to"),
        ({"text": ["a"], "no_repeat_ngram": 10**6}, 422, "no_repeat_ngram: Input should be less than or equal to 64"),
        ({"text": ["a", "b"], "constraints": [["c"]]}, 400, "constraints: 1 lists for 2 sentences"),
        ({"text": ["a"], "constraints": [["c", ""]]}, 400, "constraints[0]: an empty phrase"),
        ({"text": ["a"], "constraints": [["ж"]]}, 400, "constraints[0]: the model's target vocabulary cannot write 'ж'"),
        ({"text": ["a"], "constraints": [["c"] * 17]}, 413, "constraints[0]: 17 phrases for one sentence; the limit is 16"),
        ({"text": ["a"], "beam": 1, "constraints": [["c"]]}, 400, "constraints need beam search, not greedy search"),
        ({"text": ["a"], "constraints": [[3]]}, 422, "constraints"),
        ({"text": ["a"], "constraints_order": "sorted"}, 422, "constraints_order"),
        ({"text": ["a"], "split_by": "words"}, 422, "split_by: Input should be 'sentences' or 'lines'"),
    ],
)
def test_each_bad_request_gets_its_status_and_the_server_goes_on(server, sources, body, status, message):
    port, _ = server
    data = json.dumps(body).encode("utf-8", "surrogatepass") if isinstance(body, dict) else body
    reply = request(port, "POST", "/translate", data)
    assert reply.status == status
    assert message in reply.body["detail"] and "\n" not in reply.body["detail"]
    assert "--" not in reply.body["detail"]  # options are named as the request's fields, not as CLI flags
    assert translate(port, [sources[0]]).body["translations"] == [reverse(sources[0])]


def test_a_full_queue_answers_503_with_retry_after(reverse_pytorch, sources):
    slow = Translator(
        SlowEngine(reverse_pytorch.engine, 0.3),
        reverse_pytorch.tokenizers,
        decode=reverse_pytorch.decode,
        normalize=reverse_pytorch.normalize,
    )
    with serving(slow, ServeLimits(max_queue=1, max_wait_ms=0, batch_lines=1)) as (port, _):
        with ThreadPoolExecutor(12) as pool:
            replies = list(pool.map(lambda n: translate(port, [sources[n]]), range(12)))
    statuses = [reply.status for reply in replies]
    assert 503 in statuses and 200 in statuses and set(statuses) <= {200, 503}
    full = next(reply for reply in replies if reply.status == 503)
    assert full.headers["retry-after"] == "1" and "queue is full" in full.body["detail"]


@pytest.mark.slow
def test_a_client_that_disconnects_leaves_no_work_behind(reverse_pytorch, sources):
    slow = Translator(
        SlowEngine(reverse_pytorch.engine, 0.5),
        reverse_pytorch.tokenizers,
        decode=reverse_pytorch.decode,
        normalize=reverse_pytorch.normalize,
    )
    with serving(slow, ServeLimits(max_wait_ms=0, batch_lines=1, workers=1)) as (port, _):
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(translate, port, [sources[0]])  # keeps the one worker busy for 0.5 s
            time.sleep(0.1)
            gone = socket.create_connection(("127.0.0.1", port))
            body = json.dumps({"text": sources[1:6]}).encode()
            gone.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
            gone.sendall(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            time.sleep(0.1)
            gone.close()
            assert busy.result().status == 200
        time.sleep(0.6)
        assert translate(port, [sources[7]]).status == 200
    assert sorted(slow.engine.searched) == [1, 1]  # the five lines of the closed request were never translated


def test_a_seed_of_64_bits_is_served(server, sources):
    port, _ = server
    options = {"sampling": "topk:5", "seed": 2**64 - 1}
    first = translate(port, sources[:2], **options)
    assert first.status == 200 and first.body == translate(port, sources[:2], **options).body


def test_a_request_that_would_decode_too_much_is_413_before_it_is_queued(reverse_pytorch, sources):
    lines = sources[:3]
    caps = [
        output_cap(
            len(reverse_pytorch.segments(line)[0]) + 1, reverse_pytorch.decode, max_positions=reverse_pytorch.engine.max_positions
        )
        for line in lines
    ]
    with serving(reverse_pytorch, ServeLimits(max_work=sum(caps) * 8)) as (port, app):
        assert translate(port, lines, beam=8).status == 200
        reply = translate(port, lines, beam=9, nbest=2)
        assert reply.status == 413
        assert reply.body["detail"].startswith(f"this request may take {sum(caps) * 9} decoding steps")
        assert "the limit is" in reply.body["detail"] and "smaller beam" in reply.body["detail"]
        assert reverse_pytorch.plan(lines, Decoding(beam=9)).work == sum(caps) * 9


def test_a_sentence_or_prefix_that_would_take_too_many_steps_is_413(reverse_pytorch, sources):
    cap = output_cap(
        len(reverse_pytorch.segments(sources[0])[0]) + 1,
        reverse_pytorch.decode,
        max_positions=reverse_pytorch.engine.max_positions,
    )
    with serving(reverse_pytorch, ServeLimits(max_output_steps=cap)) as (port, _):
        assert translate(port, [sources[0]]).status == 200
        reply = translate(port, [sources[0]], prefix=[" ".join(["k"] * (cap + 1))])
        assert reply.status == 413
        assert reply.body["detail"].startswith(f"a sentence of this request may take {cap + 1} decoding steps")
        assert reverse_pytorch.plan([sources[0]], prefixes=["k " * (cap + 1)]).most_steps == cap + 1


def test_past_its_deadline_a_request_is_504_and_its_work_stops_within_a_step(reverse_pytorch, sources):
    slow, model = slow_steps(reverse_pytorch, 0.1)  # a long line: far more steps than fit in the time below
    with serving(slow, ServeLimits(max_wait_ms=0, workers=1, request_timeout=0.4)) as (port, app):
        started = time.monotonic()
        reply = translate(port, [" ".join(sources[:6])], beam=4)
        assert reply.status == 504 and "longer than the server's limit of 0.4 s" in reply.body["detail"]
        assert time.monotonic() - started < 2
        time.sleep(0.2)
        steps = model.steps
        time.sleep(0.3)
        assert model.steps == steps and app.state.batcher.stopped == 1  # the worker stopped, not the answer only
        model.delay = 0.0
        assert translate(port, [sources[1]]).body["translations"] == [reverse(sources[1])]


@pytest.mark.slow
def test_a_client_that_disconnects_mid_translation_frees_its_worker_within_a_step(reverse_pytorch, sources):
    slow, model = slow_steps(reverse_pytorch, 0.1)  # a long line: far more steps than fit in the time below
    with serving(slow, ServeLimits(max_wait_ms=0, workers=1, request_timeout=0)) as (port, app):
        gone = socket.create_connection(("127.0.0.1", port))
        body = json.dumps({"text": [" ".join(sources[:6])], "beam": 4}).encode()
        gone.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
        gone.sendall(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.3)
        assert model.steps > 0
        gone.close()
        time.sleep(0.3)
        steps = model.steps
        time.sleep(0.3)
        assert model.steps == steps and app.state.batcher.stopped == 1


def test_an_api_key_is_required_when_set(reverse_pytorch, sources):
    with serving(reverse_pytorch, ServeLimits(api_key="s3cret")) as (port, _):
        assert translate(port, [sources[0]]).status == 401
        wrong = request(port, "POST", "/translate", {"text": ["a"]}, {"Authorization": "Bearer nope"})
        assert wrong.status == 401 and "Bearer" in wrong.body["detail"]
        assert request(port, "GET", "/info").status == 401
        right = request(port, "POST", "/translate", {"text": [sources[0]]}, {"Authorization": "Bearer s3cret"})
        assert right.status == 200 and right.body["translations"] == [reverse(sources[0])]
        assert request(port, "GET", "/health").status == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "localhost.evil.example."])
def test_a_server_without_a_key_refuses_another_sites_host(server, host):
    port, _ = server
    for method, path, body in (("GET", "/info", None), ("POST", "/translate", {"text": ["a b c"]})):
        reply = request(port, method, path, body, {"Host": host})
        assert reply.status == 400 and "is not a name of this server" in reply.body["detail"], reply
        assert "\n" not in reply.body["detail"] and "MTKIT_API_KEY" in reply.body["detail"]


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:8000", "127.0.0.1", "[::1]:8000", "192.0.2.7:8000", "a.localhost"])
def test_a_server_without_a_key_answers_its_own_names_and_addresses(server, host):
    port, _ = server
    assert request(port, "GET", "/info", None, {"Host": host}).status == 200


def test_a_server_with_a_key_answers_any_host(reverse_pytorch):
    with serving(reverse_pytorch, ServeLimits(api_key="s3cret")) as (port, _):
        keyed = {"Authorization": "Bearer s3cret", "Host": "evil.example"}
        assert request(port, "GET", "/info", None, keyed).status == 200


def test_info_describes_the_model_and_its_recorded_scores(reverse_run, reverse_pytorch, tmp_path):
    (tmp_path / "scores.json").write_text(json.dumps({"test": {"BLEU": 97.5}}))
    info = model_info(reverse_pytorch, str(tmp_path))
    assert info["architecture"] == "transformer" and info["engine"] == "pytorch"
    assert info["parameters"] == reverse_pytorch.engine.model.num_parameters()
    assert info["source_language"] == reverse_run.src_lang and info["test_scores"] == {"test": {"BLEU": 97.5}}


def test_sigterm_answers_the_requests_in_flight_and_exits_zero(reverse_run, sources):
    port = free_port()
    command = [sys.executable, "-m", "mtkit", "serve", "-m", str(reverse_run.run_path), "--port", str(port), "--device", "cpu"]
    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if request(port, "GET", "/health").status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        with ThreadPoolExecutor(8) as pool:
            replies = [pool.submit(translate, port, sources[n * 8 : n * 8 + 8], beam=4) for n in range(8)]
            time.sleep(0.3)
            process.send_signal(signal.SIGTERM)
            answered = [reply.result() for reply in replies]
        assert all(reply.status == 200 for reply in answered)
        assert answered[0].body["translations"] == [reverse(line) for line in sources[:8]]
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait()


def test_batching_is_chosen_for_the_device(reverse_pytorch):
    from mtkit.runtime import cpu_cores
    from mtkit.serving.app import batching_for

    chosen = batching_for(reverse_pytorch, ServeLimits())
    assert (chosen.workers, chosen.batch_lines) == ((2, 16) if cpu_cores() >= 2 else (1, 128))  # PyTorch on CPU
    assert batching_for(reverse_pytorch, ServeLimits(workers=1, batch_lines=64)) == ServeLimits(workers=1, batch_lines=64)


def resident_mb() -> float:
    """This process's resident memory (the in-process server's included), in MB."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def post_a_large_body(port: int, megabytes: int, chunked: bool) -> str:
    """POST `megabytes` MB to /translate (with Content-Length, or chunked) from one reused 1 MB buffer;
    the status line of the answer, read after the first megabyte, then the rest sent as far as the server takes it."""
    block = b" " * 1_048_576
    framing = b"Transfer-Encoding: chunked" if chunked else f"Content-Length: {megabytes * len(block)}".encode()
    piece = b"100000\r\n" + block + b"\r\n" if chunked else block
    with socket.create_connection(("127.0.0.1", port), timeout=20) as connection:
        connection.sendall(
            b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + framing + b"\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            connection.sendall(piece)
        status = connection.recv(4096).split(b"\r\n")[0].decode()
        with contextlib.suppress(OSError):
            connection.settimeout(2)
            for _ in range(megabytes - 1):
                connection.sendall(piece)
    return status


def test_large_bodies_are_refused_before_they_are_read(server):
    port, _ = server
    before = resident_mb()
    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda chunked: post_a_large_body(port, 200, chunked), [False, True, False, True]))
    assert all(status.startswith("HTTP/1.1 413") for status in statuses), statuses
    assert resident_mb() - before < 50  # read whole, each body would have added 200 MB
    declared = request(port, "POST", "/translate", {"text": ["a " * 40_000]})
    assert declared.status == 413 and "the limit is 70336 bytes" in declared.body["detail"]
    assert translate(port, ["a b c"]).status == 200  # and the server goes on serving
