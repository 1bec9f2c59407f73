"""The rerankings of `mtkit serve` (`"rerank": "qe"` or `"mbr"`), bounded like its decoding.

A request that reranks holds one of `slots` from before its candidates are queued until it is answered;
with every slot held, a request that reranks is refused at once (`RerankBusy`, a 503), as a full queue is.
Each reranking runs on one of `slots` threads, off the event loop, and stops between two chunks of its
scorings once its awaiting is cancelled (the client has gone, or its deadline has passed), so no
thread keeps scoring for a request nobody waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from mtkit.decoding.translator import Translation
from mtkit.evaluation.rerank import Reranker, RerankStopped


class RerankBusy(Exception):
    """Every slot is held by a request that reranks; the client should retry later."""


class RerankJobs:
    """At most `slots` requests that rerank at once, each reranking on its own thread (see the module)."""

    def __init__(self, slots: int) -> None:
        self.slots, self.held = slots, 0
        self.executor = ThreadPoolExecutor(slots, thread_name_prefix="mtkit-rerank")
        self.stopped = 0  # rerankings stopped because their client had gone or their deadline passed (for tests, logs)

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold a slot for the request's decoding and reranking; `RerankBusy` at once when none is free."""
        if self.held >= self.slots:
            raise RerankBusy
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1

    async def choose(
        self, reranker: Reranker, sources: Sequence[str], *, found: list[list[Translation]]
    ) -> list[list[Translation]]:
        """`reranker.choose` on a reranking thread; cancelled, it tells the thread to stop at its next chunk."""
        stop = threading.Event()
        job = partial(self._choose, reranker, sources, found, stop)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, job)
        except asyncio.CancelledError:
            stop.set()
            raise

    def _choose(
        self, reranker: Reranker, sources: Sequence[str], found: list[list[Translation]], stop: threading.Event
    ) -> list[list[Translation]]:
        try:
            return reranker.choose(sources, found, stop=stop.is_set)
        except RerankStopped:
            self.stopped += 1
            raise

    def close(self) -> None:
        self.executor.shutdown(wait=True)
