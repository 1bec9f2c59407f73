"""Normal clients of `mtkit serve` with and without abusive ones: what the abusers cost the others.

    python -m benchmarks.abuse [--model runs/multi30k_demo] [--clients 8] [--abusers 4] [--seconds 30]
        [--server-option=--max-work=30000 ...] [--output benchmarks/results/abuse.json] [--smoke]

One `mtkit serve` subprocess (its default limits unless `--server-option` says otherwise) serves two
phases of `--seconds` each, after a warm-up: `--clients` normal clients alone, each sending
one-sentence requests from Multi30k test2016 (the model's default beam) on its own keep-alive
connection; then the same normal clients beside `--abusers` abusive ones, each cycling through the
worst requests the limits allow:
  - wide:    one long sentence at beam 64 and nbest 64, sized to just under --max-work;
  - many:    --max-lines long sentences at the default beam, as many as --max-work and --max-chars allow;
  - prefix:  one sentence with a target prefix as long as --max-chars allows (refused by --max-work);
  - hangup:  a `many` request whose client closes the connection after 0.3 s;
  - garbage: malformed JSON, unknown fields, NaN, a 64-bit-overflowing seed, a huge no_repeat_ngram;
  - glossary: 16 constraint phrases (the most a sentence may carry) on a long sentence.
Reported per phase: the normal clients' sentences/s, p50/p99 latency and errors; the abusers'
answers by status. Then the share of their throughput the normal clients kept, and their p99.
The fp32 matmul peak at the start puts the figures in context. Run it on an otherwise idle machine.
`--smoke`: a tiny model, 2 clients and 2 abusers for half a second, under small limits.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import http.client
import itertools
import json
import platform
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import common
from benchmarks.serve import DEFAULT_SRC, client, percentile, read_sentences

WORDS = "ein Mann mit einem roten Hut steht vor einem großen Gebäude und schaut auf die Straße".split()


def long_sentence(words: int) -> str:
    return " ".join(itertools.islice(itertools.cycle(WORDS), words)) + "."


def attacks(max_chars: int, max_lines: int) -> list[tuple[str, bytes, float]]:
    """(name, request body, seconds before hanging up; 0: wait for the answer) of each attack."""
    per_line = min(300, max_chars // max_lines)
    many = {"text": [long_sentence(per_line // 7)] * max_lines}
    bodies = [
        ("wide", {"text": [long_sentence(40)], "beam": 64, "nbest": 64}, 0.0),
        ("many", many, 0.0),
        ("prefix", {"text": ["Ein Hund."], "prefix": ["dog " * ((max_chars - 20) // 4)]}, 0.0),
        ("hangup", many, 0.3),
        ("glossary", {"text": [long_sentence(30)], "constraints": [["man", "hat", "red", "street"] * 4]}, 0.0),
    ]
    garbage = [b"{not json", b'{"text": ["a"], "beem": 5}', b'{"text": ["a"], "temperature": NaN}',
               b'{"text": ["a"], "sampling": "topk:5", "seed": 1180591620717411303424}',
               b'{"text": ["a"], "no_repeat_ngram": 1000000}']  # fmt: skip
    return [(name, json.dumps(body).encode(), hangup) for name, body, hangup in bodies] + [
        ("garbage", body, 0.0) for body in garbage
    ]


def abuser(port: int, stop_at: float, plan: list[tuple[str, bytes, float]], offset: int) -> collections.Counter:
    """Send the attacks in turn until the deadline; count the answers by attack and status."""
    seen: collections.Counter = collections.Counter()
    for name, body, hangup in itertools.islice(itertools.cycle(plan), offset, None):
        if time.monotonic() >= stop_at:
            break
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=hangup or 120)
        try:
            connection.request("POST", "/translate", body=body, headers={"Content-Type": "application/json"})
            seen[f"{name} {connection.getresponse().status}"] += 1
        except TimeoutError:
            seen[f"{name} hung up"] += 1
        except (OSError, http.client.HTTPException):
            seen[f"{name} failed"] += 1
        finally:
            connection.close()
    return seen


def phase(port: int, sentences: list[str], clients: int, abusers: int, seconds: float, plan: list) -> dict:
    take, lock = itertools.count(), threading.Lock()
    stop_at = time.monotonic() + seconds
    start = time.perf_counter()
    with ThreadPoolExecutor(clients + abusers) as pool:
        normal = [pool.submit(client, port, sentences, take, lock, stop_at, 10**9) for _ in range(clients)]
        bad = [pool.submit(abuser, port, stop_at, plan, n) for n in range(abusers)]
        logs, counts = [f.result() for f in normal], sum((f.result() for f in bad), collections.Counter())
    wall = time.perf_counter() - start
    latencies = [latency for log in logs for latency in log.latencies]
    return {
        "normal_clients": clients,
        "abusers": abusers,
        "seconds": round(wall, 2),
        "requests": len(latencies),
        "sentences_per_s": round(len(latencies) / wall, 2),
        "p50_ms": round(1000 * percentile(latencies, 50), 1) if latencies else None,
        "p99_ms": round(1000 * percentile(latencies, 99), 1) if latencies else None,
        "errors": sum(log.errors for log in logs),
        "abuser_answers": dict(sorted(counts.items())),
    }


def option(options: list[str], name: str, default: int) -> int:
    """The value of `--name=N` among the server options, else the server's default."""
    values = [int(o.split("=", 1)[1]) for o in options if o.startswith(f"--{name}=")]
    return values[-1] if values else default


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("runs/multi30k_demo"))
    parser.add_argument("--src", type=Path, default=DEFAULT_SRC)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--abusers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--server-option", dest="server_options", action="append", default=[], help="e.g. --max-work=30000")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/abuse.json"))
    common.add_smoke_options(parser)
    parser.set_defaults(warmup_seconds=5.0)  # --smoke shortens it
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny model (trained in `work` the first time), 2 clients and 2 abusers for half a second, small limits."""
    args.model, args.src = common.smoke_run(work), common.smoke_corpus(work) / "test_2016_flickr.de.gz"
    args.clients, args.abusers, args.seconds, args.warmup_seconds = 2, 2, 0.5, 0.5
    args.server_options = ["--max-lines=4", "--max-chars=400", "--max-work=2000", *args.server_options]


def run_benchmark(args: argparse.Namespace) -> dict:
    """The normal clients alone, then beside the abusers, on one server (after a warm-up)."""
    sentences = read_sentences(args.src, None)
    plan = attacks(option(args.server_options, "max-chars", 20_000), option(args.server_options, "max-lines", 64))
    report = {
        **common.smoke_label(args),
        "date": datetime.date.today().isoformat(),
        "model": str(args.model),
        "server_options": args.server_options,
        "machine": {"python": platform.python_version()},
        "matmul_gflop_per_s": common.matmul_gflop_per_s(smoke=args.smoke),
    }
    port = common.free_port()
    with tempfile.TemporaryFile("w+") as log:
        process = common.start_server(args.model, port, args.server_options, 0, log)
        try:
            phase(port, sentences, 1, 0, args.warmup_seconds, plan)
            report["alone"] = phase(port, sentences, args.clients, 0, args.seconds, plan)
            report["with_abusers"] = phase(port, sentences, args.clients, args.abusers, args.seconds, plan)
        finally:
            common.stop_server(process)
    report["throughput_kept"] = round(report["with_abusers"]["sentences_per_s"] / report["alone"]["sentences_per_s"], 3)
    return report


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, run_benchmark, args.output)
    for name in ("alone", "with_abusers"):
        row = report[name]
        print(
            f"{name:13} {row['normal_clients']} clients + {row['abusers']} abusers: {row['sentences_per_s']} sent/s, "
            f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, errors {row['errors']}"
        )
    print(f"abusers' answers: {report['with_abusers']['abuser_answers']}")
    print(f"normal clients kept {100 * report['throughput_kept']:.0f}% of their throughput; matmul peak "
          f"{report['matmul_gflop_per_s']} GFLOP/s; written to {args.output}")  # fmt: skip


if __name__ == "__main__":
    main()
