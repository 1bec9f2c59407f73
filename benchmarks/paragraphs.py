"""Paragraphs benchmark: Multi30k test2016 captions joined into paragraphs, translated with and without splitting.

    python -m benchmarks.paragraphs -m RUN_DIR [--data ../shared/data/multi30k] [--src de --tgt en] [--seed 1]
        [--beam 5] [--sentences 1000] [--out benchmarks/results/paragraphs.json] [--smoke]

The first `--sentences` test2016 captions are joined, in order, into paragraphs of 2 to 5 captions (sizes drawn
with `--seed`), one paragraph a line, the captions joined by a space; their references are joined alike. Reported:
- the splitter's boundary recovery on the joined sources: the share of true boundaries (where a caption ends) it
  finds, also among those after a caption that ends with a full stop, question or exclamation mark, and the
  boundaries it finds that are not true ones; with the run's sentence ends (`mtkit priors RUN`) when it has them,
  and by sentencex's rules alone;
- BLEU against the joined references of the paragraphs translated with `--split-by sentences`, with the rules
  alone, with `--split-by lines` (each paragraph whole, as before splitting existed) and sentence by sentence (each caption
  on its own line, its translations joined), with the outputs' length over the sentence-by-sentence one;
- dropped sentences: paragraphs whose translation has fewer sentences (by the target language's splitter) than the
  source paragraph (by the source's), and paragraphs `mtkit evaluate`'s dropped flag marks (a source sentence no
  output word aligns to);
- throughput: captions/s given as paragraphs (`--split-by sentences`) against the same captions one per line,
  timed back to back in one process, alternating A B A (one per line, paragraphs, one per line), with the
  matmul peak (fp32) of the decoding device. Run it on an otherwise idle machine.
`--smoke` (no -m needed): a tiny model and the first 10 captions of the tests' slice.
"""

from __future__ import annotations

import argparse
import datetime
import random
import time
from pathlib import Path

import torch

from benchmarks import common
from mtkit.decoding.line_parts import LineParts
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translation, Translator
from mtkit.documents.sentences import SentenceSplitter, source_splitter, split_sentences
from mtkit.evaluation.dropped import dropped_lines
from mtkit.evaluation.metrics import bleu
from mtkit.options import SplitBy
from mtkit.textio import file_lines

SIZES = (2, 5)  # captions per paragraph, at least and at most
STOPS = (".", "!", "?")


def read(path: Path) -> list[str]:
    return [text for _, text in file_lines(path)]


def paragraph_sizes(count: int, seed: int) -> list[int]:
    """Sizes of consecutive paragraphs covering `count` (at least 2) captions, each of 2-5 captions."""
    rng, sizes = random.Random(seed), []
    while (left := count - sum(sizes)) > 0:
        size = min(rng.randint(*SIZES), left)
        if left - size == 1:  # no paragraph of one caption at the end
            size = size + 1 if size < SIZES[1] else size - 1
        sizes.append(size)
    return sizes


def joined(lines: list[str], sizes: list[int]) -> list[str]:
    """The lines joined, in order, into paragraphs of `sizes` lines, by a space."""
    found, start = [], 0
    for size in sizes:
        found.append(" ".join(lines[start : start + size]))
        start += size
    return found


def boundaries(parts: LineParts) -> set[int]:
    """Character offsets where the second, third, ... sentence of a line starts."""
    found, offset = set(), len(parts.spaces[0])
    for part, space in zip(parts.parts[:-1], parts.spaces[1:-1], strict=True):
        offset += len(part) + len(space)
        found.add(offset)
    return found


def boundary_recovery(captions: list[str], sizes: list[int], splitter: SentenceSplitter) -> dict:
    """How many of the true boundaries of the joined paragraphs `splitter` finds, and how many it adds."""
    true_found = after_stop = after_stop_found = false = total = start = 0
    for size in sizes:
        group = captions[start : start + size]
        start += size
        true = {len(" ".join(group[: k + 1])) + 1: group[k].rstrip().endswith(STOPS) for k in range(size - 1)}
        found = boundaries(splitter.cut(" ".join(group)))
        total += len(true)
        true_found += len(found & set(true))
        after_stop += sum(true.values())
        after_stop_found += sum(stop for offset, stop in true.items() if offset in found)
        false += len(found - set(true))
    return {
        "true": total,
        "found": true_found,
        "recovered": true_found / max(total, 1),
        "after_stop": after_stop,
        "recovered_after_stop": after_stop_found / max(after_stop, 1),
        "false": false,
    }


def translated(
    translator: Translator, lines: list[str], *, beam: int, splitter: SentenceSplitter | None, aligned: bool = False
) -> tuple[list[Translation], float]:
    """The best translation of each line, and the seconds it took."""
    start = time.perf_counter()
    found = translator.translate_nbest(lines, Decoding(beam=beam, alignments=aligned), splitter=splitter)
    return [best[0] for best in found], time.perf_counter() - start


def dropped(
    translator: Translator,
    paragraphs: list[str],
    *,
    beam: int,
    splitter: SentenceSplitter | None,
    counted: tuple[SentenceSplitter, str],
) -> dict:
    """Paragraphs translated with fewer sentences than they have (by `counted`: the source's splitter, the target's
    language), and those the dropped flag marks (untimed)."""
    source, target = counted
    outputs, _ = translated(translator, paragraphs, beam=beam, splitter=splitter, aligned=True)
    cut = [source.cut(paragraph) for paragraph in paragraphs]
    fewer = sum(len(split_sentences(out.text, target).parts) < len(parts.parts) for out, parts in zip(outputs, cut, strict=True))
    tagged = translator.leads(Decoding())[0] is not None
    flagged = sum(dropped_lines(translator, cut, best=outputs, tagged=tagged))
    return {"fewer_sentences": fewer, "flagged": flagged}


def run_benchmark(args: argparse.Namespace) -> dict:
    """Boundaries, then BLEU and dropped sentences of the three ways, then the A B A timing."""
    translator = Translator.load(args.model, fast_paths=True)
    captions = read(args.data / f"test_2016_flickr.{args.src}.gz")[: args.sentences]
    references = read(args.data / f"test_2016_flickr.{args.tgt}.gz")[: args.sentences]
    sizes = paragraph_sizes(len(captions), args.seed)
    paragraphs, joined_references = joined(captions, sizes), joined(references, sizes)
    splitter = source_splitter(translator, language=args.src)  # with the run's sentence ends when it has them
    rules = SentenceSplitter(splitter.language)
    translator.translate(captions[:16], beam=args.beam)  # warm-up
    device = getattr(translator.engine, "device", torch.device("cpu"))
    report: dict = {
        **common.smoke_label(args),
        "date": datetime.date.today().isoformat(),
        "model": str(args.model),
        "machine": common.machine_facts(),
        "device": str(device),
        "matmul_gflop_per_s": common.matmul_flops_per_s(device, smoke=args.smoke) / 1e9,
        "captions": len(captions),
        "paragraphs": len(paragraphs),
        "sentence_ends": splitter.ends is not None,
        "boundaries": boundary_recovery(captions, sizes, splitter),
        "boundaries_by_rules_alone": boundary_recovery(captions, sizes, rules),
    }
    one_per_line, first = translated(translator, captions, beam=args.beam, splitter=None)
    cut, seconds = translated(translator, paragraphs, beam=args.beam, splitter=splitter)
    _, last = translated(translator, captions, beam=args.beam, splitter=None)
    whole, _ = translated(translator, paragraphs, beam=args.beam, splitter=None)
    by_rules, _ = translated(translator, paragraphs, beam=args.beam, splitter=rules)
    by_sentence = joined([t.text for t in one_per_line], sizes)
    report["bleu"] = {
        "sentence_by_sentence": bleu(by_sentence, joined_references),
        SplitBy.SENTENCES.value: bleu([t.text for t in cut], joined_references),
        "sentences_by_rules_alone": bleu([t.text for t in by_rules], joined_references),
        SplitBy.LINES.value: bleu([t.text for t in whole], joined_references),
    }
    length = sum(map(len, by_sentence))
    report["length_over_sentence_by_sentence"] = {
        SplitBy.SENTENCES.value: sum(len(t.text) for t in cut) / length,
        SplitBy.LINES.value: sum(len(t.text) for t in whole) / length,
    }
    counted = (splitter, args.tgt)
    report["dropped"] = {
        name: dropped(translator, paragraphs, beam=args.beam, splitter=chosen, counted=counted)
        for name, chosen in ((SplitBy.SENTENCES.value, splitter), (SplitBy.LINES.value, None))
    }
    report["speed"] = {
        "captions_per_s_one_per_line": [len(captions) / first, len(captions) / last],
        "captions_per_s_as_paragraphs": len(captions) / seconds,
        "paragraphs_per_s": len(paragraphs) / seconds,
    }
    report["speed"]["ratio"] = report["speed"]["captions_per_s_as_paragraphs"] / (
        sum(report["speed"]["captions_per_s_one_per_line"]) / 2
    )
    report["matmul_gflop_per_s_after"] = common.matmul_flops_per_s(device, smoke=args.smoke) / 1e9
    return report


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, help="a trained Multi30k run, --src into --tgt (required but with --smoke)")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/multi30k"))
    parser.add_argument("--src", default="de", help="the captions' language (test_2016_flickr.SRC.gz)")
    parser.add_argument("--tgt", default="en", help="the references' language")
    parser.add_argument("--seed", type=int, default=1, help="draws the paragraphs' sizes")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=1000, help="test2016 captions used (from the first)")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/paragraphs.json"))
    return common.parsed_with_model(parser, flag="-m/--model")


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny model (trained in `work` the first time) and the first captions of the tests' slice."""
    args.model, args.data, args.sentences = common.smoke_run(work), common.smoke_corpus(work), 10


def print_table(report: dict) -> None:
    print(f"{report['captions']} captions in {report['paragraphs']} paragraphs")
    for key, name in (("boundaries", "the splitter"), ("boundaries_by_rules_alone", "the rules alone")):
        found = report[key]
        print(
            f"{name} found {found['found']} of {found['true']} boundaries ({100 * found['recovered']:.1f}%; "
            f"{100 * found['recovered_after_stop']:.1f}% of the {found['after_stop']} after a full stop), and "
            f"{found['false']} false ones"
        )
    print(f"the run's sentence ends (mtkit priors): {'used' if report['sentence_ends'] else 'none'}")
    lengths = report["length_over_sentence_by_sentence"]
    for name, score in report["bleu"].items():
        lost = report["dropped"].get(name)
        extra = ""
        if lost is not None:
            extra = (
                f"; length {lengths[name]:.2f}x; {lost['fewer_sentences']} paragraphs with fewer sentences, "
                f"{lost['flagged']} flagged dropped"
            )
        print(f"{name:21} BLEU {score:.2f}{extra}")
    speed = report["speed"]
    one = " / ".join(f"{value:.1f}" for value in speed["captions_per_s_one_per_line"])
    print(
        f"captions/s one per line {one}, as paragraphs {speed['captions_per_s_as_paragraphs']:.1f} "
        f"({speed['paragraphs_per_s']:.1f} paragraphs/s): {speed['ratio']:.2f}x; matmul peak "
        f"{report['matmul_gflop_per_s']:.0f} / {report['matmul_gflop_per_s_after']:.0f} GFLOP/s (before / after)"
    )


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, run_benchmark, args.out)
    print_table(report)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
