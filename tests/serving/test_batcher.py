"""The request batcher, driven by a stub translator: merging, grouping by decoding, order, a full queue."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from mtkit.decoding.options import Decoding
from mtkit.decoding.search import SearchStopped
from mtkit.decoding.translator import Translation
from mtkit.serving.batcher import Batcher, QueueFull


class UpperCaser:
    """A translator stub: each line upper-cased, and every call recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], Decoding]] = []

    def translate_nbest(self, lines, decoding, prefixes=None, stop=None, constraints=None, splitter=None):  # noqa: ANN001, ANN201 - the Translator's signature
        assert stop is not None and not stop()  # its clients are waiting
        self.calls.append((list(lines), decoding))
        return [[Translation(text=line.upper(), score=0.0, tokens=[])] for line in lines]


async def translate_together(batcher: Batcher, requests: list[tuple[list[str], Decoding]]) -> list[list[str]]:
    worker = asyncio.create_task(batcher.run())
    try:
        found = await asyncio.gather(*(batcher.translate(lines, decoding) for lines, decoding in requests))
    finally:
        worker.cancel()
    return [[best[0].text for best in lines] for lines in found]


def test_concurrent_requests_are_one_engine_call_and_each_gets_its_own_lines_in_order():
    stub = UpperCaser()
    batcher = Batcher(stub, max_wait=0.2, max_queue=10, batch_lines=100)
    requests = [(["a", "b"], Decoding()), (["c"], Decoding()), (["d", "e", "f"], Decoding())]
    assert asyncio.run(translate_together(batcher, requests)) == [["A", "B"], ["C"], ["D", "E", "F"]]
    assert batcher.batches == 1 and stub.calls == [(["a", "b", "c", "d", "e", "f"], Decoding())]
    batcher.close()


def test_requests_with_other_decodings_are_translated_in_separate_calls():
    stub = UpperCaser()
    batcher = Batcher(stub, max_wait=0.2, max_queue=10, batch_lines=100)
    requests = [(["a"], Decoding(beam=2)), (["b"], Decoding(beam=4)), (["c"], Decoding(beam=2))]
    assert asyncio.run(translate_together(batcher, requests)) == [["A"], ["B"], ["C"]]
    assert sorted((lines, decoding.beam) for lines, decoding in stub.calls) == [(["a", "c"], 2), (["b"], 4)]
    batcher.close()


def test_a_full_queue_refuses_at_once():
    async def overfill() -> None:
        batcher = Batcher(UpperCaser(), max_wait=0.0, max_queue=1, batch_lines=10)
        waiting = asyncio.ensure_future(batcher.translate(["a"], Decoding()))  # no worker runs: it stays queued
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await batcher.translate(["b"], Decoding())
        waiting.cancel()
        batcher.close()

    asyncio.run(overfill())


class WaitsForStop:
    """A translator stub that decodes until its `stop` says every client has gone, as search does."""

    def __init__(self) -> None:
        self.started = threading.Event()

    def translate_nbest(self, lines, decoding, prefixes=None, stop=None, constraints=None, splitter=None):  # noqa: ANN001, ANN201 - the Translator's signature
        self.started.set()
        deadline = time.monotonic() + 10
        while not stop() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise SearchStopped


def test_a_translation_whose_clients_have_all_gone_is_stopped():
    async def scenario() -> Batcher:
        stub = WaitsForStop()
        batcher = Batcher(stub, max_wait=0.0, max_queue=4, batch_lines=8)
        worker = asyncio.create_task(batcher.run())
        client = asyncio.create_task(batcher.translate(["a"], Decoding()))
        await asyncio.get_running_loop().run_in_executor(None, stub.started.wait, 10)
        client.cancel()  # the client goes (disconnect or deadline) while its line is being decoded
        for _ in range(500):
            if batcher.stopped:
                break
            await asyncio.sleep(0.01)
        worker.cancel()
        return batcher

    batcher = asyncio.run(scenario())
    assert batcher.stopped == 1 and batcher.batches == 0


def test_chunk_spans_cut_consecutive_lines_at_the_work_limit():
    from mtkit.serving.batcher import chunk_spans

    assert chunk_spans([500, 500, 500, 500, 500], 1000) == [range(0, 2), range(2, 4), range(4, 5)]
    assert chunk_spans([3000, 10, 10], 1000) == [range(0, 1), range(1, 3)]  # a line over the limit is a chunk alone
    assert chunk_spans([500, 500], 0) == [range(0, 2)]  # 0: no chunks
    assert chunk_spans([], 1000) == [range(0, 0)]


def test_a_large_request_is_decoded_in_chunks_and_a_small_one_goes_between_them():
    async def scenario(stub: UpperCaser) -> tuple[list[str], list[str]]:
        batcher = Batcher(stub, max_wait=0.0, max_queue=4, batch_lines=1, workers=1, chunk_work=1000)
        large = asyncio.ensure_future(batcher.translate(list("abcdef"), Decoding(), line_work=[500] * 6))
        await asyncio.sleep(0)  # queued before the worker starts: three chunks of two lines
        small = asyncio.ensure_future(batcher.translate(["z"], Decoding(), line_work=[100]))
        await asyncio.sleep(0)
        worker = asyncio.create_task(batcher.run())
        try:
            found = await asyncio.gather(large, small)
        finally:
            worker.cancel()
        batcher.close()
        return [best[0].text for best in found[0]], [best[0].text for best in found[1]]

    stub = UpperCaser()
    assert asyncio.run(scenario(stub)) == (list("ABCDEF"), ["Z"])
    assert [lines for lines, _ in stub.calls] == [["z"], ["a", "b"], ["c", "d"], ["e", "f"]]


def test_a_request_counts_as_waiting_until_its_last_chunk_is_taken():
    async def scenario() -> None:
        batcher = Batcher(UpperCaser(), max_wait=0.0, max_queue=1, batch_lines=2, chunk_work=1000)
        waiting = asyncio.ensure_future(batcher.translate(list("abcd"), Decoding(), line_work=[1000] * 4))
        await asyncio.sleep(0)
        assert batcher.waiting == 1 and batcher.queue.qsize() == 4
        with pytest.raises(QueueFull):
            await batcher.translate(["x"], Decoding())
        waiting.cancel()
        batcher.close()

    asyncio.run(scenario())


def test_a_worker_with_a_work_limit_takes_only_small_requests():
    from mtkit.serving.batcher import WorkQueue

    async def scenario() -> None:
        queue = WorkQueue()
        queue.put((2000, 0, "large"))
        assert queue.take(500) is None and queue.qsize() == 1
        assert await queue.get(500, timeout=0.05) is None  # no small request comes: None after the timeout
        waiting = asyncio.ensure_future(queue.get(500))
        await asyncio.sleep(0)
        queue.put((100, 1, "small"))
        assert (await waiting)[2] == "small"
        assert queue.take()[2] == "large"  # a worker without a limit takes it

    asyncio.run(scenario())


def test_with_two_workers_the_second_keeps_to_small_requests():
    batcher = Batcher(UpperCaser(), max_wait=0.0, max_queue=4, batch_lines=8, workers=2, chunk_work=2000)
    assert batcher.small_work == 1000
    assert Batcher(UpperCaser(), max_wait=0.0, max_queue=4, batch_lines=8, workers=1, chunk_work=2000).small_work is None
    batcher.close()
