"""What one server accepts and how it batches (`mtkit serve`'s limits), with their defaults stated once.

Light on imports, so the command line reads its defaults here without loading FastAPI.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ServeLimits:
    """What one server accepts and how it batches."""

    max_lines: int = 64  # lines per request
    max_chars: int = 20_000  # characters per request
    max_queue: int = 256  # requests waiting for the worker; more get 503
    # decoding steps x beam rows one request may ask for (each sentence's output cap x beam), and its reranking's
    # scorings (evaluation.rerank.Reranker.work)
    max_work: int = 30_000
    max_reranks: int = 2  # requests that rerank (qe, mbr) in flight at once; more get 503
    max_output_steps: int = 1_000  # decoding steps one sentence may take (its output cap, or its prefix if longer)
    # a request of more work is decoded in chunks of consecutive lines of at most this work, each queued on its
    # own (smallest first), so a large request holds a worker for one chunk at a time
    chunk_work: int = 2_000
    request_timeout: float = 60.0  # seconds from queueing to answer, reranking included (0: none); later is 504, the work stopped
    max_wait_ms: float = 5.0  # how long the worker waits to fill a batch
    batch_lines: int = 0  # lines merged into one engine call at most (0: 16 for PyTorch on CPU, else 128)
    workers: int = 0  # decoding threads, each with its share of the cores (0: 2 for PyTorch on CPU, else 1)
    api_key: str | None = None  # when set, /translate and /info need "Authorization: Bearer KEY"


def body_limit(max_chars: int) -> int:
    """The most bytes a request of `max_chars` characters can need: JSON writes a character as at most 12
    bytes (an escaped surrogate pair), with 64 KiB for the options and the JSON around the text."""
    return 12 * max_chars + 65_536
