"""Load test of `mtkit serve` over loopback, against offline batch translation of the same sentences in one run.

    python -m benchmarks.serve [--model runs/multi30k_demo] [--src FILE] [--clients 1,8,32]
        [--seconds 30] [--max-requests N] [--server-option=--max-wait-ms=10 ...] [--smoke]

Offline first: `Translator.translate` over all the source sentences in one call in this process
(model loading and a warm-up not timed), with nothing else running; again after the server has
stopped, and the mean of the two is the offline figure (their difference shows the drift).
Between them, `mtkit serve -m MODEL` runs in a subprocess; once /health says ready and a few
warm-up requests are answered, each level of concurrency runs in turn: that many client threads,
each with its own keep-alive `http.client` connection, send one-sentence requests taking the
sentences in order from a shared counter, until `--seconds` have passed or `--max-requests`
(default: every sentence once) have been sent. Per level: sentences/s, p50/p95/p99 latency,
errors (non-200 answers and failed connections), translations that differ from the offline ones,
and the CPU seconds the server and the load generator used. Both sides decode with the model's
default beam. The fp32 matmul peak measured at the start puts the figures
in context. Run it on an otherwise idle machine; compare figures as ratios taken in one run.
`--smoke` serves a tiny model to 1 and 2 clients, a second each at most.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import resource
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks import common
from benchmarks.common import send
from mtkit.decoding.translator import Translator
from mtkit.runtime import set_threads
from mtkit.textio import file_lines

DEFAULT_SRC = Path("../shared/data/multi30k/test_2016_flickr.de.gz")
WARMUP_SENTENCES = 16


@dataclass
class ClientLog:
    """What one client thread saw: latencies of answered requests, failures, and the translations."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    translations: dict[int, str] = field(default_factory=dict)  # sentence index -> translation


@dataclass
class Level:
    """One level of concurrency: throughput, latency percentiles, failures, and CPU used."""

    clients: int
    requests: int
    errors: int
    seconds: float
    sentences_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    differ_from_offline: int
    server_cpu_s: float
    client_cpu_s: float


def read_sentences(path: Path, limit: int | None) -> list[str]:
    """The non-empty lines of a text file (.gz fine), at most `limit`."""
    lines = (text.strip() for _, text in file_lines(path))
    return list(itertools.islice((line for line in lines if line), limit))


def offline_rate(translator: Translator, sentences: list[str]) -> tuple[float, list[str]]:
    """Sentences/s of one batch `translate` call over all `sentences`, and the translations."""
    start = time.perf_counter()
    translations = translator.translate(sentences)
    return len(sentences) / (time.perf_counter() - start), translations


def client(port: int, sentences: list[str], take: itertools.count, lock: threading.Lock, stop_at: float, limit: int) -> ClientLog:
    """Send one-sentence requests until the deadline or the request cap; reconnect after a failure."""
    log = ClientLog()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while time.monotonic() < stop_at:
        with lock:
            index = next(take)
        if index >= limit:
            break
        start = time.perf_counter()
        try:
            status, body = send(connection, "POST", "/translate", {"text": [sentences[index % len(sentences)]]})
        except (OSError, http.client.HTTPException, json.JSONDecodeError):
            log.errors += 1
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            continue
        if status != 200 or len(body.get("translations", [])) != 1:
            log.errors += 1
            continue
        log.latencies.append(time.perf_counter() - start)
        log.translations[index] = body["translations"][0]
    connection.close()
    return log


def server_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def load_level(
    port: int, pid: int, sentences: list[str], reference: list[str], clients: int, seconds: float, limit: int
) -> Level:
    """`clients` concurrent clients for at most `seconds` and `limit` requests in all."""
    take, lock = itertools.count(), threading.Lock()
    cpu_before, own_before = server_cpu_seconds(pid), own_cpu_seconds()
    start = time.perf_counter()
    stop_at = time.monotonic() + seconds
    with ThreadPoolExecutor(clients) as pool:
        logs = list(pool.map(lambda _: client(port, sentences, take, lock, stop_at, limit), range(clients)))
    wall = time.perf_counter() - start
    latencies = [latency for log in logs for latency in log.latencies]
    answered = {index: text for log in logs for index, text in log.translations.items()}
    differ = sum(text != reference[index % len(reference)] for index, text in answered.items())
    return Level(
        clients=clients,
        requests=len(latencies),
        errors=sum(log.errors for log in logs),
        seconds=round(wall, 2),
        sentences_per_s=round(len(latencies) / wall, 1),
        p50_ms=round(1000 * percentile(latencies, 50), 1) if latencies else float("nan"),
        p95_ms=round(1000 * percentile(latencies, 95), 1) if latencies else float("nan"),
        p99_ms=round(1000 * percentile(latencies, 99), 1) if latencies else float("nan"),
        differ_from_offline=differ,
        server_cpu_s=round(server_cpu_seconds(pid) - cpu_before, 1),
        client_cpu_s=round(own_cpu_seconds() - own_before, 1),
    )


def serve_levels(args: argparse.Namespace, sentences: list[str], reference: list[str]) -> list[Level]:
    """Start the server, warm it up, run each level of concurrency, stop it."""
    port = args.port or common.free_port()
    with tempfile.TemporaryFile("w+") as log:
        process = common.start_server(args.model, port, args.server_options, args.server_threads, log)
        try:
            load_level(port, process.pid, sentences, reference, 1, 60, WARMUP_SENTENCES)
            limit = args.max_requests or len(sentences)
            return [load_level(port, process.pid, sentences, reference, n, args.seconds, limit) for n in args.clients]
        finally:
            common.stop_server(process)


def markdown_table(report: dict) -> str:
    """The README table: one row per level, and the offline figure."""
    rows = [
        "| clients | sentences/s | p50 ms | p95 ms | p99 ms | errors | requests | vs offline |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = report["offline"]["sentences_per_s"]
    for level in report["serve"]:
        rows.append(
            f"| {level['clients']} | {level['sentences_per_s']:.1f} | {level['p50_ms']:.0f} | {level['p95_ms']:.0f} | "
            f"{level['p99_ms']:.0f} | {level['errors']} | {level['requests']} | {100 * level['sentences_per_s'] / base:.0f}% |"
        )
    offline = report["offline"]
    measured = f"{base:.1f} ({offline['before_sentences_per_s']:.1f} before, {offline['after_sentences_per_s']:.1f} after)"
    rows.append(f"| offline `translate` | {measured} | | | | | {offline['sentences']} | 100% |")
    return "\n".join(rows)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("runs/multi30k_demo"), help="run directory or export to serve")
    parser.add_argument("--src", type=Path, default=DEFAULT_SRC, help="source sentences, one a line (.gz fine)")
    parser.add_argument("--limit", type=int, help="use only the first N sentences")
    parser.add_argument("--clients", type=lambda text: [int(n) for n in text.split(",")], default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=30.0, help="time bound of each level")
    parser.add_argument("--max-requests", type=int, help="request cap of each level (default: one per sentence)")
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    parser.add_argument(
        "--server-option",
        dest="server_options",
        action="append",
        default=[],
        help="an option for `mtkit serve`, e.g. --max-wait-ms=10",
    )
    parser.add_argument("--server-threads", type=int, default=0, help="the server's torch threads (default: torch's own)")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/serve.json"))
    common.add_smoke_options(parser)
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny model (trained in `work` the first time) on 10 sentences, 1 and 2 clients for a second at most."""
    args.model, args.src = common.smoke_run(work), common.smoke_corpus(work) / "test_2016_flickr.de.gz"
    args.clients, args.seconds, args.max_requests, args.server_threads = [1, 2], 1.0, 8, 1


def run_benchmark(args: argparse.Namespace) -> dict:
    """Offline, the server at each level, offline again (its drift shows); the ratio uses their mean."""
    sentences = read_sentences(args.src, args.limit)
    set_threads(0)
    report: dict = {
        **common.smoke_label(args),
        "model": str(args.model),
        "src": str(args.src),
        "server_options": args.server_options,
        "server_threads": args.server_threads or "default",
        "machine": common.machine_facts(),
        "matmul_gflop_per_s": common.matmul_gflop_per_s(smoke=args.smoke),
    }
    translator = Translator.load(args.model, device="cpu", fast_paths=True)
    translator.translate(sentences[:WARMUP_SENTENCES])  # warm-up, not timed
    before, reference = offline_rate(translator, sentences)
    levels = serve_levels(args, sentences, reference)
    after, _ = offline_rate(translator, sentences)
    offline = (before + after) / 2
    report["offline"] = {
        "sentences": len(sentences),
        "beam": translator.decode.beam,
        "sentences_per_s": round(offline, 1),
        "before_sentences_per_s": round(before, 1),
        "after_sentences_per_s": round(after, 1),
    }
    report["serve"] = [asdict(level) for level in levels]
    report["ratio"] = {"clients": levels[-1].clients, "serve_over_offline": round(levels[-1].sentences_per_s / offline, 3)}
    return report


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, run_benchmark, args.output)
    print(f"fp32 matmul peak {report['matmul_gflop_per_s']:.0f} GFLOP/s; beam {report['offline']['beam']}; {args.model}")
    print(markdown_table(report))
    ratio = report["ratio"]
    print(f"{ratio['clients']} clients / offline: {100 * ratio['serve_over_offline']:.1f}%")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
