"""Beam search with and without a vocabulary shortlist, at OPUS-MT's and NLLB-600M's shapes; and BLEU with and without.

    python -m benchmarks.shortlist [--sentences 100] [--cap 40] [--repeats 3] [--lines 29000] [--threads 0]
        [--out benchmarks/results/shortlist.json] [--smoke]
    python -m benchmarks.shortlist --bleu RUN --src FILE --ref FILE [--beam 5] [--tgt-lang L] [--out FILE]

Speed: builds a random model of OPUS-MT's shape (a vocabulary of 58,101 pieces, `benchmarks/opus_mt.py`'s
builder, English -> French) and one of NLLB-200-distilled-600M's (256,206 rows, `benchmarks/nllb.py`'s builder,
German -> English), imports each into an mtkit run and gives it a shortlist (`mtkit shortlist RUN --src --tgt`:
eflomal's alignments of the first `--lines` Multi30k training pairs, the defaults' K and frequent pieces). The
same Multi30k test2016 sentences are then translated at beam 5 by the PyTorch engine with the shortlist and
without it (`--no-shortlist`), every output capped at `--cap` tokens as the decoding benchmarks cap them (a random
model rarely ends a sentence), the two taking turns (A B A B), each timed run a process of its own; then the
OPUS-MT-shaped model's CTranslate2 int8 export with its vocabulary map and without (`use_vmap`). Prints each pair's
seconds, tokens written and ratio with the matmul peak of the same run, and writes JSON.

BLEU (`--bleu RUN`, a run with a shortlist): translates `--src` with the shortlist and without, and prints both
BLEU scores (sacreBLEU, against `--ref`) and the share of the full vocabulary's output pieces that the shortlist of
their sentence holds. Needs `transformers` and ctranslate2 for the speed part (pip install -e '.[dev]'); offline.
`--smoke`: tiny models of both layouts from the tests' slice, every run in this process, then `--bleu` on the
tiny OPUS-MT-shaped run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks import common, nllb, opus_mt, turns
from benchmarks.turns import alternate, timed
from mtkit.decoding.ct2_engine import load_export
from mtkit.decoding.options import Decoding, ShortlistBuild
from mtkit.decoding.shortlist import build_shortlist
from mtkit.decoding.translator import Translator
from mtkit.evaluation.metrics import bleu
from mtkit.exporters.ctranslate2 import export_ctranslate2
from mtkit.importers.marian import import_marian
from mtkit.run_files import RunFiles
from mtkit.runtime import set_threads
from mtkit.textio import model_text, read_lines

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
SYSTEMS = ["full vocabulary", "shortlist"]
# each shape: its builder's shape, the languages of its Multi30k files, and its language codes (NLLB's)
SHAPES = {
    "opus_mt": {"shape": opus_mt.OPUS_MT, "smoke": opus_mt.SMOKE_SHAPE, "src": "en", "tgt": "fr", "codes": {}},
    "nllb_600m": {
        "shape": nllb.NLLB_600M,
        "smoke": nllb.SMOKE_SHAPE,
        "src": "de",
        "tgt": "en",
        "codes": {"src_lang": nllb.SRC_LANG, "tgt_lang": nllb.TGT_LANG},
    },
}


def build(name: str, folder: Path, data: Path, *, smoke: bool) -> Path:
    """The random model of shape `name` imported into folder/run, with its shortlist; the run directory."""
    row = SHAPES[name]
    shape = row["smoke" if smoke else "shape"]
    (folder / "hf").mkdir(parents=True)
    if name == "opus_mt":
        opus_mt.build_opus_mt_sized(folder / "hf", data, shape)
        import_marian(str(folder / "hf"), folder / "run")
    else:
        nllb.build_nllb_shaped(folder / "hf", data, shape)
        common.MtkitCommands(in_process=True).run(["import", "auto", folder / "hf", "-o", folder / "run"])
    return folder / "run"


def shortlisted(run: Path, data: Path, name: str, lines: int) -> dict:
    """Build and save the run's shortlist from the first `lines` training pairs; what it recorded."""
    row = SHAPES[name]
    files = {side: data / f"train.{row[side]}.gz" for side in ("src", "tgt")}
    shortlist = build_shortlist(run, ShortlistBuild(lines=lines, **files))
    shortlist.save(RunFiles(run).shortlist)
    return {**shortlist.info, "always_kept": len(shortlist.frequent)}


def child(task: dict) -> dict:
    """One timed run, meant for a process of its own: the engine loaded, warmed up on a few sentences, timed once."""
    set_threads(task["threads"])
    if task["engine"] == "ctranslate2":
        translator = Translator.over(load_export(task["model"], threads=task["threads"]))
    else:
        translator = Translator.load(task["model"], fast_paths=True)
    translator.decode = dataclasses.replace(translator.decode, max_len_a=0.0, max_len_b=task["cap"])
    decoding = Decoding(beam=5, shortlist=task["system"] == "shortlist", **task["codes"])
    translator.translate_nbest(task["sources"][:4], decoding)
    found: list = []
    seconds = timed(lambda: found.extend(translator.translate_nbest(task["sources"], decoding)))
    return {"seconds": seconds, "tokens": sum(len(best[0].tokens) for best in found)}


def child_process(task: dict) -> dict:
    """`child(task)` in a fresh process (`python -m benchmarks.shortlist --child TASK`)."""
    return turns.in_own_process("benchmarks.shortlist", task)


def compared(task: dict, repeats: int, run_child) -> dict:  # noqa: ANN001 - the child runner
    """Both systems' median seconds and tokens, taking turns, and the speed-up of the shortlist."""
    runs = alternate(task, SYSTEMS, repeats, run_child)
    figures = {
        name: {
            "seconds": round(statistics.median(run["seconds"] for run in found), 3),
            "tokens": statistics.median(run["tokens"] for run in found),
        }
        for name, found in runs.items()
    }
    figures["speedup"] = round(figures["full vocabulary"]["seconds"] / figures["shortlist"]["seconds"], 2)
    return figures


def report(title: str, figures: dict) -> None:
    print(title)
    for name in SYSTEMS:
        print(f"  {name:<16} {figures[name]['seconds']:8.2f} s  {figures[name]['tokens']:7.0f} tokens")
    print(f"  shortlist: {figures['speedup']:.2f}x the full vocabulary")


def run_speed(args: argparse.Namespace) -> dict:
    """Each shape built, shortlisted and timed at beam 5 with and without; the OPUS-MT shape's CT2 export too."""
    set_threads(args.threads)
    result = {**common.smoke_label(args), "date": datetime.date.today().isoformat()}
    result |= {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    result |= {"matmul_gflops": common.matmul_gflop_per_s(smoke=args.smoke), "cap": args.cap, "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as scratch:
        for name, row in SHAPES.items():
            run = build(name, Path(scratch) / name, args.data, smoke=args.smoke)
            sources = common.first_lines(args.data / f"test_2016_flickr.{row['src']}.gz", args.sentences)
            task = {"threads": args.threads, "cap": args.cap, "sources": sources, "codes": row["codes"]}
            figures = {"shortlist": shortlisted(run, args.data, name, args.lines), "sentences": len(sources)}
            figures["pytorch"] = compared({**task, "engine": "pytorch", "model": str(run)}, args.repeats, args.run_child)
            report(f"{name}, PyTorch beam 5, {len(sources)} sentences x {args.cap} tokens", figures["pytorch"])
            if name == "opus_mt":
                export_ctranslate2(run, Path(scratch) / "ct2", quantization="int8")
                ct2 = {**task, "engine": "ctranslate2", "model": str(Path(scratch) / "ct2")}
                figures["ctranslate2_int8"] = compared(ct2, args.repeats, args.run_child)
                report(f"{name}, CTranslate2 int8 beam 5, vocabulary map or not", figures["ctranslate2_int8"])
            result[name] = figures
        if args.smoke:
            smoke_data = args.data
            args.src, args.ref = smoke_data / "test_2016_flickr.en.gz", smoke_data / "test_2016_flickr.fr.gz"
            result["bleu"] = run_bleu(Path(scratch) / "opus_mt" / "run", args)
    return result


def run_bleu(run: Path, args: argparse.Namespace) -> dict:
    """BLEU with the shortlist and without on `args.src` against `args.ref`, and the share of the full vocabulary's
    output pieces in their sentence's shortlist."""
    translator = Translator.load(run, fast_paths=True)
    shortlist = getattr(translator.engine, "shortlist", None)
    if shortlist is None:
        raise SystemExit(f"{run}: no shortlist to compare; build one with `mtkit shortlist {run}` first")
    sources, references = read_lines(args.src), read_lines(args.ref)
    found = {}
    for name in SYSTEMS:
        decoding = Decoding(beam=args.beam, shortlist=name == "shortlist", tgt_lang=args.tgt_lang)
        found[name] = [best[0] for best in translator.translate_nbest(sources, decoding)]
    covered = total = 0
    for line, translation in zip(sources, found["full vocabulary"], strict=True):
        allowed = set(shortlist.pieces([translator.tokenizers.src.encode(model_text(line, translator.normalize))]).tolist())
        covered += sum(token in allowed for token in translation.tokens)
        total += len(translation.tokens)
    scores = {name: round(bleu([t.text for t in found[name]], references), 2) for name in SYSTEMS}
    result = {"run": str(run), "src": str(args.src), "beam": args.beam, "sentences": len(sources), "bleu": scores}
    result |= {"covered_output_pieces": round(covered / total, 4) if total else 1.0, "shortlist": shortlist.info}
    result["identical_outputs"] = sum(a.tokens == b.tokens for a, b in zip(*found.values(), strict=True))
    print(f"BLEU beam {args.beam}: full vocabulary {scores['full vocabulary']}, shortlist {scores['shortlist']}")
    print(f"  output pieces of the full vocabulary in their sentence's shortlist: {100 * result['covered_output_pieces']:.2f}%")
    print(f"  identical outputs: {result['identical_outputs']} of {len(sources)}")
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=100, help="Multi30k test2016 sentences translated")
    parser.add_argument("--cap", type=int, default=40, help="output tokens per sentence (a fixed cap for both)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each system, taking turns")
    parser.add_argument("--lines", type=int, default=29000, help="Multi30k training pairs aligned for the shortlists")
    parser.add_argument("--threads", type=int, default=0, help="torch and CTranslate2 threads (0: all cores)")
    parser.add_argument("--bleu", type=Path, help="BLEU mode: a run directory with a shortlist")
    parser.add_argument("--src", type=Path, help="with --bleu: the sentences to translate")
    parser.add_argument("--ref", type=Path, help="with --bleu: their references")
    parser.add_argument("--beam", type=int, default=5, help="with --bleu: the beam size")
    parser.add_argument("--tgt-lang", help="with --bleu: the language to translate into, for a model of several")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/shortlist.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one timed run, started by alternate()
    common.add_smoke_options(parser)
    parser.set_defaults(data=DATA, run_child=child_process)  # --smoke: tiny, in this process
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: tiny models from the first lines of the tests' slice (in `work`), 4 sentences, in this process."""
    args.data, args.run_child = common.smoke_corpus(work), child
    args.sentences, args.cap, args.repeats, args.lines, args.threads = 4, 5, 1, 300, 1


def main() -> None:
    args = parse_args()
    if args.child:
        turns.answer_child(child, args.child)
        return
    if args.bleu is not None:
        if args.src is None or args.ref is None:
            raise SystemExit("--bleu RUN needs --src FILE and --ref FILE")
        result = common.measure_and_write(args, tiny_arguments, lambda given: run_bleu(given.bleu, given), args.out)
        return
    result = common.measure_and_write(args, tiny_arguments, run_speed, args.out)
    print(f"matmul peak {result['matmul_gflops']} GFLOP/s, {result['threads']} threads; written to {args.out}")


if __name__ == "__main__":
    main()
