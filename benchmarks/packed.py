"""Decoding with packed linear weights against plain `nn.Linear`, in one process, taking turns.

    python benchmarks/packed.py --model RUN_DIR [--sentences 500] [--rounds 3] [--lang de] [--cap 0] [--out FILE]

Loads the run twice: as `Translator.load` gives it (large weights laid out once for oneDNN,
`mtkit/models/packed.py`) and with those layers turned back into plain `nn.Linear`. Both translate
the same Multi30k test2016 sentences (German unless --lang) at beam 5 and greedy, A B A B after one untimed round;
prints the seconds, the median ratio and how many outputs are identical, with the matmul peak of
the same run, and writes JSON. `--cap N` fixes every output at most N tokens (0: the run's own cap).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

from mtkit.decoding.translator import Decoding, Translator
from mtkit.models.packed import PackedLinear
from mtkit.runtime import set_threads

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402  the matmul peak, measured the same way as for every benchmark

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def translators(run: Path, cap: int) -> dict[str, Translator]:
    """The run as loaded (packed) and the same run with its packed layers made plain again."""
    loaded = {"packed": Translator.load(run), "plain": Translator.load(run)}
    for module in loaded["plain"].engine.model.modules():
        if isinstance(module, PackedLinear):
            module.__class__ = nn.Linear
    for translator in loaded.values():
        if cap:
            translator.decode = dataclasses.replace(translator.decode, max_len_a=0.0, max_len_b=cap)
    return loaded


def alternate(loaded: dict[str, Translator], sources: list[str], beam: int, rounds: int) -> dict:
    """Seconds of each side per round (one untimed round first) and how many outputs agree."""
    seconds: dict[str, list[float]] = {name: [] for name in loaded}
    outputs: dict[str, list[str]] = {}
    for index in range(rounds + 1):
        for name, translator in loaded.items():
            start = time.perf_counter()
            outputs[name] = [h[0].text for h in translator.translate_nbest(sources, Decoding(beam=beam))]
            if index:
                seconds[name].append(round(time.perf_counter() - start, 2))
    ratio = statistics.median(seconds["plain"]) / statistics.median(seconds["packed"])
    same = sum(a == b for a, b in zip(outputs["plain"], outputs["packed"], strict=True))
    return {"seconds": seconds, "plain_over_packed": round(ratio, 3), "identical": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a run directory (PyTorch engine)")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lang", default="de", help="source language of the test2016 sentences (de, en, fr, cs)")
    parser.add_argument("--cap", type=int, default=0, help="most output tokens (0: the run's own rule)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/packed.json"))
    args = parser.parse_args()
    set_threads(0)
    with gzip.open(DATA / f"test_2016_flickr.{args.lang}.gz", "rt", encoding="utf-8") as handle:
        sources = [line.strip() for line in itertools.islice(handle, args.sentences)]
    loaded = translators(args.model, args.cap)
    packed = sum(isinstance(m, PackedLinear) for m in loaded["packed"].engine.model.modules())
    result = {"date": datetime.date.today().isoformat(), "model": str(args.model), "packed_layers": packed}
    result |= {"sentences": len(sources), "threads": torch.get_num_threads(), "matmul_gflops_before": speed_peak()}
    for beam in (5, 1):
        result[f"beam{beam}"] = found = alternate(loaded, sources, beam, args.rounds)
        print(f"beam {beam}: plain {found['seconds']['plain']} s, packed {found['seconds']['packed']} s, "
              f"{found['plain_over_packed']}x; identical outputs {found['identical']}/{len(sources)}")  # fmt: skip
    result["matmul_gflops_after"] = speed_peak()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{packed} packed layers; matmul peak {result['matmul_gflops_before']} / {result['matmul_gflops_after']} GFLOP/s")


def speed_peak() -> float:
    return round(speed.matmul_flops_per_s() / 1e9, 1)


if __name__ == "__main__":
    main()
