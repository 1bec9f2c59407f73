"""Scale benchmark: `tokenizer train`, `prepare` and `translate` on corpora of real size, as JSON.

    python -m benchmarks.scale --corpus ../shared/data/multi30k --pairs 1000000,5000000 \
        --translate-lines 20000,200000 [--work /tmp/mtkit-scale] [--source-tree DIR] [--out scale.json] [--smoke]

1. Builds a WMT-length synthetic corpus of N pairs from a small one: each pair joins two random
   pairs of the given corpus (train.de.gz / train.en.gz), so nearly every pair is unique and
   survives cleaning (about 26 words a side from Multi30k).
2. Runs `mtkit tokenizer train` and `mtkit prepare` on it as a user would (a subprocess each), and
   reports seconds, pairs/s and the peak RSS of the whole process tree (workers included),
   sampled from /proc every 50 ms.
3. Trains a tiny model for a few hundred updates on the smallest corpus and reports the peak RSS
   of `mtkit translate` (greedy) at each --translate-lines input size.

`--source-tree DIR` runs the mtkit of another checkout (PYTHONPATH=DIR) with this interpreter, so
an old commit and the new one are measured back to back on one machine. Linux only (/proc).
`--smoke`: a 200-pair corpus from the tests' slice, and 10 lines translated by the smoke mode's tiny
model (trained in this process) instead of step 3's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

SAMPLE_SECONDS = 0.05
# A model small enough to translate 200k lines in minutes on 2 cores, trained just enough to stop its outputs.
TINY_MODEL = """model: {layers: 1, d_model: 64, heads: 2, ffn_dim: 128, dropout: 0.0}
train: {batch_tokens: 4096, max_steps: 300, validate_every: 300, log_every: 100, lr: 0.003, warmup_steps: 50}
decode: {beam: 1, max_len_a: 1.2, max_len_b: 5}
"""


def build_corpus(corpus: Path, pairs: int, out_dir: Path, seed: int = 1) -> tuple[Path, Path]:
    """Write out_dir/train.{de,en} with `pairs` lines, each joining two random corpus pairs; reused if present."""
    src_path, tgt_path = out_dir / "train.de", out_dir / "train.en"
    done = out_dir / "complete"
    if done.is_file() and done.read_text() == str(pairs):
        return src_path, tgt_path
    out_dir.mkdir(parents=True, exist_ok=True)
    with gzip.open(corpus / "train.de.gz", "rt", encoding="utf-8") as file:
        sources = file.read().splitlines()
    with gzip.open(corpus / "train.en.gz", "rt", encoding="utf-8") as file:
        targets = file.read().splitlines()
    rng = random.Random(seed)
    with open(src_path, "w", encoding="utf-8") as src_file, open(tgt_path, "w", encoding="utf-8") as tgt_file:
        for _ in range(pairs):
            first, second = rng.randrange(len(sources)), rng.randrange(len(sources))
            src_file.write(f"{sources[first]} {sources[second]}\n")
            tgt_file.write(f"{targets[first]} {targets[second]}\n")
    done.write_text(str(pairs))
    return src_path, tgt_path


def tree_rss_bytes(root: int) -> int:
    """Resident memory of `root` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            statm = Path(f"/proc/{entry}/statm").read_text()
        except OSError:  # the process ended while we looked
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
        rss[int(entry)] = int(statm.split()[1]) * page
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def measure(command: list[str], env: dict[str, str], log: Path) -> dict:
    """Run a command to its end; its wall seconds and the peak RSS of its process tree (MB).

    It runs in the source tree named by PYTHONPATH: `python -m mtkit` imports from the current directory first.
    """
    start = time.perf_counter()
    with open(log, "w") as log_file:
        process = subprocess.Popen(command, env=env, cwd=env["PYTHONPATH"], stdout=log_file, stderr=subprocess.STDOUT)
        peak = 0
        while process.poll() is None:
            peak = max(peak, tree_rss_bytes(process.pid))
            time.sleep(SAMPLE_SECONDS)
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        sys.exit(f"{' '.join(command)} failed (exit {process.returncode}); see {log}")
    return {"seconds": round(seconds, 2), "peak_rss_mb": round(peak / 2**20, 1)}


def write_recipe(
    path: Path, name: str, train: tuple[Path, Path], valid: tuple[Path, Path], vocab_size: int, extra: str = ""
) -> Path:
    path.write_text(
        f"name: {name}\nsrc_lang: de\ntgt_lang: en\nrun_dir: {path.parent / 'runs' / name}\n"
        f"data_dir: {path.parent / 'data' / name}\n"
        f"data:\n  train: {{src: {train[0]}, tgt: {train[1]}}}\n  valid: {{src: {valid[0]}, tgt: {valid[1]}}}\n"
        f"  max_len: 100\ntokenizer:\n  vocab_size: {vocab_size}\n  max_sentences: 300000\n{extra}",
        encoding="utf-8",
    )
    return path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("../shared/data/multi30k"))
    parser.add_argument("--pairs", default="1000000,5000000", help="corpus sizes, comma-separated")
    parser.add_argument("--translate-lines", default="20000,200000", help="translate input sizes; empty skips")
    parser.add_argument("--work", type=Path, default=Path("/tmp/mtkit-scale"))
    parser.add_argument("--source-tree", type=Path, help="run the mtkit of this checkout (PYTHONPATH)")
    parser.add_argument("--skip-tokenizer", action="store_true", help="reuse the tokenizer of an earlier run")
    parser.add_argument("--out", "--output", type=Path, default=Path("scale.json"))
    common.add_smoke_options(parser)
    parser.set_defaults(vocab_size=8000, translate_model=None)  # --smoke: a small vocabulary, its own tiny model
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: 200 pairs from the tests' slice, and 10 lines translated by the tiny model (trained in `work` the first time)."""
    args.corpus, args.work, args.translate_model = common.smoke_corpus(work), work / "scale", common.smoke_run(work)
    args.pairs, args.translate_lines, args.vocab_size = "200", "10", 300


def main() -> None:
    args = parse_args()
    results = common.measure_and_write(args, tiny_arguments, run_benchmark, args.out, indent=2)
    print(json.dumps(results, indent=2))


def run_benchmark(args: argparse.Namespace) -> dict:
    """The matmul peak, `prepare` at each corpus size (the report written after each), then `translate`."""
    env = dict(os.environ, PYTHONPATH=str((args.source_tree or common.ROOT).resolve()))
    mtkit = [sys.executable, "-m", "mtkit"]
    args.work.resolve().mkdir(parents=True, exist_ok=True)
    results: dict = {**common.smoke_label(args), "machine": platform.machine(), "cores": os.cpu_count()}
    results |= {"prepare": [], "translate": []}
    if args.source_tree:
        results["source_tree"] = str(args.source_tree)
    results["matmul_gflops"] = common.matmul_gflop_per_s(smoke=args.smoke)
    print(f"fp32 matmul peak: {results['matmul_gflops']} GFLOP/s", flush=True)
    for pairs in [int(n) for n in args.pairs.split(",") if n]:
        results["prepare"].append(benchmark_prepare(args, mtkit, env, pairs))
        common.write_json(args.out, results, indent=2)
    sizes = [int(n) for n in args.translate_lines.split(",") if n]
    if sizes:
        model = args.translate_model or train_tiny_model(args, mtkit, env)
        results["translate"] = benchmark_translate(args, mtkit, env, sizes, model)
    return results


def benchmark_prepare(args: argparse.Namespace, mtkit: list[str], env: dict, pairs: int) -> dict:
    """`tokenizer train` (unless --skip-tokenizer) and `prepare` on a corpus of `pairs` pairs: seconds and peak RSS."""
    work, corpus = args.work.resolve(), args.corpus.resolve()
    valid = (corpus / "val.de.gz", corpus / "val.en.gz")
    print(f"building a {pairs:,}-pair corpus ...", flush=True)
    train = build_corpus(args.corpus, pairs, work / f"corpus_{pairs}")
    recipe = write_recipe(work / f"scale_{pairs}.yaml", f"scale_{pairs}", train, valid, args.vocab_size)
    row: dict = {"pairs": pairs}
    if not args.skip_tokenizer:
        row["tokenizer"] = measure([*mtkit, "tokenizer", "train", str(recipe)], env, work / f"tokenizer_{pairs}.log")
        print(f"  tokenizer train: {row['tokenizer']}", flush=True)
    row["prepare"] = measure([*mtkit, "prepare", str(recipe)], env, work / f"prepare_{pairs}.log")
    row["prepare"]["pairs_per_s"] = round(pairs / row["prepare"]["seconds"])
    print(f"  prepare: {row['prepare']}", flush=True)
    return row


def train_tiny_model(args: argparse.Namespace, mtkit: list[str], env: dict) -> Path:
    """Train TINY_MODEL on the given corpus (tokenizer, prepare, train: a subprocess each); its run directory."""
    work, corpus = args.work.resolve(), args.corpus.resolve()
    train, valid = (corpus / "train.de.gz", corpus / "train.en.gz"), (corpus / "val.de.gz", corpus / "val.en.gz")
    recipe = write_recipe(work / "scale_tiny.yaml", "scale_tiny", train, valid, 2000, TINY_MODEL)
    for stage in (["tokenizer", "train"], ["prepare"], ["train"]):
        measure([*mtkit, *stage, str(recipe), *(["--overwrite"] if stage == ["train"] else [])], env, work / "tiny.log")
    return work / "runs" / "scale_tiny"


def benchmark_translate(args: argparse.Namespace, mtkit: list[str], env: dict, sizes: list[int], model: Path) -> list[dict]:
    """Peak RSS of greedy `mtkit translate` with a tiny model at each input size."""
    work, corpus = args.work.resolve(), args.corpus.resolve()
    with gzip.open(corpus / "train.de.gz", "rt", encoding="utf-8") as file:
        lines = file.read().splitlines()
    rows = []
    for size in sizes:
        source = work / f"translate_{size}.de"
        source.write_text("".join(lines[i % len(lines)] + "\n" for i in range(size)), encoding="utf-8")
        output = work / f"translate_{size}.en"
        command = [*mtkit, "translate", "-m", str(model), "-i", str(source), "-o", str(output), "--beam", "1"]
        row = {"lines": size, **measure(command, env, work / f"translate_{size}.log")}
        row["lines_per_s"] = round(size / row["seconds"])
        print(f"  translate: {row}", flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
