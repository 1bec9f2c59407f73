"""Decoding with packed linear weights against plain `nn.Linear`, in one process, taking turns.

    python -m benchmarks.packed --model RUN_DIR [--sentences 500] [--rounds 3] [--lang de] [--cap 0] [--out FILE] [--smoke]

Loads the run twice: with every large weight laid out once for oneDNN (`mtkit/models/packed.py`; a plain
`Translator.load(..., fast_paths=True)` packs only the shapes measured faster on this machine) and with those
layers turned back into plain `nn.Linear`. Both translate the same Multi30k test2016 sentences (German unless
--lang) at beam 5 and greedy, A B A B after one untimed round; prints the seconds, the median ratio and how many
outputs are identical, with the matmul peak of the same run, and writes JSON. `--cap N` fixes every output at
most N tokens (0: the run's own cap).
`--smoke` (no --model needed): a tiny model on 10 sentences, one round.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks import common
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.models.packed import PackedLinear, pack_linears
from mtkit.runtime import set_threads

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def translators(run: Path, cap: int) -> dict[str, Translator]:
    """The run with every large layer packed, and the same run with its packed layers made plain again."""
    loaded = {"packed": Translator.load(run, fast_paths=True), "plain": Translator.load(run, fast_paths=True)}
    pack_linears(loaded["packed"].engine.model)  # every large layer, whichever shapes this machine measured faster
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a run directory (PyTorch engine); required but with --smoke")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lang", default="de", help="source language of the test2016 sentences (de, en, fr, cs)")
    parser.add_argument("--cap", type=int, default=0, help="most output tokens (0: the run's own rule)")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/packed.json"))
    parser.set_defaults(data=DATA)  # --smoke reads the tests' slice
    return common.parsed_with_model(parser)


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny model (trained in `work` the first time) on 10 sentences, one round."""
    args.model, args.data = common.smoke_run(work), common.smoke_corpus(work)
    args.sentences, args.rounds = 10, 1


def run_benchmark(args: argparse.Namespace) -> dict:
    """Packed against plain at beam 5 and greedy, printing each, with the matmul peak before and after."""
    set_threads(0)
    sources = common.first_lines(args.data / f"test_2016_flickr.{args.lang}.gz", args.sentences)
    loaded = translators(args.model, args.cap)
    packed = sum(isinstance(m, PackedLinear) for m in loaded["packed"].engine.model.modules())
    result = {**common.smoke_label(args), "date": datetime.date.today().isoformat(), "model": str(args.model)}
    result |= {"packed_layers": packed, "sentences": len(sources), "threads": torch.get_num_threads()}
    result["matmul_gflops_before"] = common.matmul_gflop_per_s(smoke=args.smoke)
    for beam in (5, 1):
        result[f"beam{beam}"] = found = alternate(loaded, sources, beam, args.rounds)
        print(f"beam {beam}: plain {found['seconds']['plain']} s, packed {found['seconds']['packed']} s, "
              f"{found['plain_over_packed']}x; identical outputs {found['identical']}/{len(sources)}")  # fmt: skip
    result["matmul_gflops_after"] = common.matmul_gflop_per_s(smoke=args.smoke)
    return result


def main() -> None:
    args = parse_args()
    result = common.measure_and_write(args, tiny_arguments, run_benchmark, args.out)
    gflops = f"{result['matmul_gflops_before']} / {result['matmul_gflops_after']}"
    print(f"{result['packed_layers']} packed layers; matmul peak {gflops} GFLOP/s")


if __name__ == "__main__":
    main()
