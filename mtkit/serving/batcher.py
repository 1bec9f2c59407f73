"""Dynamic batching for `mtkit serve`: requests from many clients merged into one engine's batches.

Each request becomes one or more `QueuedRequest`s in a queue, ordered by their decoding work
(`Plan.line_work`; the smallest first, then first come first served), so a few large requests do not
hold back the many small ones: a request of more than `chunk_work` is cut into chunks of consecutive
lines of at most that work (one line at least), each queued on its own, so a large request holds a
worker for one chunk at a time and small requests that arrive meanwhile go first. With two workers or
more, the last one takes only queued requests of at most half a chunk, so small requests always find a
worker that no large request holds. At most `max_queue` requests wait at once.

A worker takes the smallest queued request, waits at most `max_wait` for more (up to `batch_lines`
lines; one that would overflow them waits for the next batch), groups those that ask for the same
decoding (and the same cutting into sentences), and translates each group with one
`Translator.translate_nbest` call, which sorts the lines (or their sentences) by length into token-budget
batches. The model runs on one worker thread, off the event loop, and
each queued request gets its own translations back in its own order. One whose client has gone or
whose deadline has passed (its future cancelled) is dropped before it is translated, and a group
whose every client is gone stops between two decoding steps, freeing the worker.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from mtkit.decoding.line_parts import Splitter
from mtkit.decoding.options import Decoding
from mtkit.decoding.search import SearchStopped
from mtkit.decoding.terminology.terms import Term
from mtkit.decoding.translator import Translation, Translator


class QueueFull(Exception):
    """The queue holds `max_queue` requests already; the client should retry later."""


@dataclass(frozen=True, kw_only=True)
class QueuedRequest:
    """What waits in the queue: a client's request whole, or one chunk of its consecutive lines."""

    lines: list[str]
    decoding: Decoding
    prefixes: list[str] | None
    future: asyncio.Future = field(repr=False)
    constraints: list[list[Term]] | None = None
    splitter: Splitter | None = None  # cuts each line into the sentences translated (None: each line whole)
    work: int = 0  # the plan's decoding work: smaller requests are taken first
    queued: list[int] = field(default_factory=lambda: [1], repr=False)  # its request's chunks still queued (shared)


Entry = tuple[int, int, QueuedRequest]  # (work, arrival, request): the queue's order


class WorkQueue:
    """Queued requests by (work, arrival), the smallest first; a worker may ask only for those of at most some work."""

    def __init__(self) -> None:
        self._heap: list[Entry] = []
        self._changed = asyncio.Event()

    def qsize(self) -> int:
        return len(self._heap)

    def put(self, entry: Entry) -> None:
        heapq.heappush(self._heap, entry)
        self._changed.set()

    def take(self, limit: int | None = None) -> Entry | None:
        """The smallest request if its work is at most `limit` (None: any), else None."""
        if self._heap and (limit is None or self._heap[0][0] <= limit):
            return heapq.heappop(self._heap)
        return None

    async def get(self, limit: int | None = None, timeout: float | None = None) -> Entry | None:
        """`take(limit)` once there is such a request; None if `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (entry := self.take(limit)) is None:
            self._changed.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return None
        return entry


def chunk_spans(line_work: Sequence[int], chunk_work: int) -> list[range]:
    """Consecutive lines in spans of at most `chunk_work` work each (one line at least; 0: one span)."""
    spans, start, total = [], 0, 0
    for index, work in enumerate(line_work):
        if chunk_work and index > start and total + work > chunk_work:
            spans.append(range(start, index))
            start, total = index, 0
        total += work
    return [*spans, range(start, len(line_work))]


class Batcher:
    """Merges concurrent requests into batches for one translator (start with `run()` as a task)."""

    def __init__(
        self,
        translator: Translator,
        *,
        max_wait: float,
        max_queue: int,
        batch_lines: int,
        workers: int = 1,
        chunk_work: int = 0,
    ) -> None:
        self.translator = translator
        self.max_wait, self.batch_lines, self.workers = max_wait, batch_lines, workers
        self.max_queue, self.chunk_work = max_queue, chunk_work
        self.waiting = 0  # requests with a chunk in the queue
        self.queue = WorkQueue()
        # With two workers or more, the last takes only queued requests of at most half a chunk: small requests always
        # find a worker that no large one holds.
        self.small_work = chunk_work // 2 if chunk_work and workers > 1 else None
        self.arrivals = itertools.count()  # first come, first served among equal work
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="mtkit-decode")
        self.batches = 0  # engine calls made, for tests and logs
        self.stopped = 0  # engine calls stopped because every client of theirs had gone

    async def translate(
        self,
        lines: Sequence[str],
        decoding: Decoding,
        *,
        prefixes: Sequence[str] | None = None,
        constraints: list[list[Term]] | None = None,
        line_work: Sequence[int] = (),
        splitter: Splitter | None = None,
    ) -> list[list[Translation]]:
        """The translations of `lines`, once the batches holding them are done; `QueueFull` at once if full.

        line_work: each line's decoding work (`Plan.line_work`), which orders and cuts the request.
        splitter: cuts each line into the sentences translated (`Translator.translate_nbest`).
        """
        if self.waiting >= self.max_queue:
            raise QueueFull
        loop = asyncio.get_running_loop()
        line_work = list(line_work) or [0] * len(lines)
        spans = chunk_spans(line_work, self.chunk_work)
        queued = [len(spans)]
        requests = [
            QueuedRequest(
                lines=[lines[i] for i in span],
                decoding=decoding,
                prefixes=[prefixes[i] for i in span] if prefixes is not None else None,
                future=loop.create_future(),
                constraints=[constraints[i] for i in span] if constraints is not None else None,
                splitter=splitter,
                work=sum(line_work[i] for i in span),
                queued=queued,
            )
            for span in spans
        ]
        self.waiting += 1
        for request in requests:
            self.queue.put((request.work, next(self.arrivals), request))
        try:
            parts = await asyncio.gather(*(request.future for request in requests))
        finally:
            for request in requests:  # a client gone or an error: its other chunks are dropped before translation
                request.future.cancel()
        return [translations for part in parts for translations in part]

    async def run(self) -> None:
        """The workers, each on its own thread: collect, group, translate, answer; forever (cancel to stop)."""
        limits = [None] * (self.workers - 1) + [self.small_work if self.workers > 1 else None]
        await asyncio.gather(*(self._work(limit) for limit in limits))

    async def _work(self, limit: int | None) -> None:
        loop = asyncio.get_running_loop()
        while True:
            requests = await self._collect(limit)
            for (decoding, splitter), group in _by_decoding(requests).items():
                await self._translate_group(loop, decoding, group, splitter=splitter)

    def close(self) -> None:
        self.executor.shutdown(wait=True)

    async def _collect(self, limit: int | None = None) -> list[QueuedRequest]:
        """The smallest queued request (of at most `limit` work) and those that arrive within `max_wait`, up to
        `batch_lines` lines (one that would overflow them goes back to wait for the next batch)."""
        requests = [self._taken(await self.queue.get(limit))]
        deadline = time.monotonic() + self.max_wait
        while (room := self.batch_lines - sum(len(request.lines) for request in requests)) > 0:
            entry = self.queue.take(limit) or await self.queue.get(limit, deadline - time.monotonic())
            if entry is None:
                break
            if len(entry[2].lines) > room:
                self.queue.put(entry)
                break
            requests.append(self._taken(entry))
        return [request for request in requests if not request.future.done()]  # a cancelled request's client has gone

    def _taken(self, entry: Entry | None) -> QueuedRequest:
        """The queued request of an entry, counted out of the queue (a client's request stops waiting with its last chunk)."""
        assert entry is not None  # `get` without a timeout waits for one
        request = entry[2]
        request.queued[0] -= 1
        self.waiting -= request.queued[0] == 0
        return request

    async def _translate_group(
        self, loop: asyncio.AbstractEventLoop, decoding: Decoding, requests: list[QueuedRequest], *, splitter: Splitter | None
    ) -> None:
        requests = [request for request in requests if not request.future.done()]
        if not requests:
            return
        lines = [line for request in requests for line in request.lines]
        prefixes = None
        if any(request.prefixes is not None for request in requests):
            prefixes = [prefix for request in requests for prefix in (request.prefixes or [""] * len(request.lines))]
        constraints = None
        if any(request.constraints is not None for request in requests):
            constraints = [terms for request in requests for terms in (request.constraints or [[]] * len(request.lines))]
        stop = partial(_all_gone, requests)
        translate = partial(
            self.translator.translate_nbest, prefixes=prefixes, stop=stop, constraints=constraints, splitter=splitter
        )
        try:
            found = await loop.run_in_executor(self.executor, translate, lines, decoding)
        except SearchStopped:
            self.stopped += 1
            return
        except Exception as err:  # noqa: BLE001 - every waiting client gets the error, the worker goes on
            for request in requests:
                if not request.future.done():
                    request.future.set_exception(err)
            return
        self.batches += 1
        start = 0
        for request in requests:
            if not request.future.done():
                request.future.set_result(found[start : start + len(request.lines)])
            start += len(request.lines)


def _all_gone(requests: list[QueuedRequest]) -> bool:
    """True once no request of a group has a client waiting (asked from the decoding thread)."""
    return all(request.future.done() for request in requests)


def _by_decoding(requests: list[QueuedRequest]) -> dict[tuple[Decoding, Splitter | None], list[QueuedRequest]]:
    """The requests that ask for the same decoding and the same cutting into sentences, together."""
    groups: dict[tuple[Decoding, Splitter | None], list[QueuedRequest]] = {}
    for request in requests:
        groups.setdefault((request.decoding, request.splitter), []).append(request)
    return groups
