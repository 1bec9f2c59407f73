"""Terminology benchmark: lexically constrained beam search on Multi30k test2016 (German -> English).

    python -m benchmarks.terminology -m RUN_DIR [--data ../shared/data/multi30k] [--seed 1]
        [--beam 5] [--out benchmarks/results/terminology.json] [--smoke]

Builds its own test sets from the references, seeded:
  (a) ngrams: for each sentence, one or two reference n-grams (1 to 3 words, apart) as constraints;
  (b) glossary: German -> English word pairs learned from the 29,000 training pairs (for each German
      word of 4+ letters seen 10+ times, the English word of best Dice coefficient, kept when the
      coefficient is at least 0.5), written as a `--glossary` TSV; each test sentence gets the terms
      whose source word is in its source (as `--glossary` finds them) and whose target word is in
      its reference (a term is also met with a capital first letter). Its lines are reported in two
      groups: those whose unconstrained translation already had every term ("right"), and the
      others ("missed").
For each set: inclusion at the piece level (the search met every term before its output cap) and at
the word level (each term appears as whole words in the detokenised output), BLEU without and with
the constraints, and sentences/s at beam 5 with and without them, timed back to back in one
process, alternating A B A (unconstrained, constrained, unconstrained), with the matmul peak (fp32) of the
decoding device. Run it on an otherwise idle machine. `--smoke` (no -m needed): a tiny model, 10 sentences,
a glossary learned from 1,000 pairs.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import random
import re
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import common
from mtkit.decoding.options import Decoding
from mtkit.decoding.terminology.terms import Glossary, Term, contains_term
from mtkit.decoding.translator import Translation, Translator
from mtkit.evaluation.metrics import bleu
from mtkit.textio import file_lines

WORD = re.compile(r"\w+")


def read(path: Path) -> list[str]:
    return [text for _, text in file_lines(path)]


def ngram_terms(references: list[str], seed: int) -> list[list[Term]]:
    """One or two reference word n-grams (1-3 words, not overlapping) per sentence."""
    rng = random.Random(seed)
    terms = []
    for number, reference in enumerate(references):
        words = reference.rstrip(".").split()
        chosen: list[Term] = []
        taken: set[int] = set()
        for _ in range(rng.choice((1, 2))):
            size = rng.randint(1, min(3, len(words)))
            start = rng.randrange(0, len(words) - size + 1)
            if taken & set(range(start, start + size)):
                continue
            taken |= set(range(start, start + size))
            chosen.append(
                Term(alternatives=(" ".join(words[start : start + size]).strip(",;:"),), where=f"sentence {number + 1}")
            )
        terms.append([t for t in chosen if t.alternatives[0]])
    return terms


def learn_glossary(sources: list[str], targets: list[str], path: Path) -> int:
    """German -> English word pairs by Dice coefficient over sentence pairs, written as a glossary TSV."""
    pairs, german, english = collections.Counter(), collections.Counter(), collections.Counter()
    for source, target in zip(sources, targets, strict=True):
        de = {w.lower() for w in WORD.findall(source) if len(w) >= 4 and w.isalpha()}
        en = {w.lower() for w in WORD.findall(target) if len(w) >= 3 and w.isalpha()}
        german.update(de)
        english.update(en)
        pairs.update((d, e) for d in de for e in en)
    best: dict[str, tuple[float, str]] = {}
    for (d, e), both in pairs.items():
        if german[d] >= 10 and both >= 10:
            dice = 2 * both / (german[d] + english[e])
            if dice >= 0.5 and dice > best.get(d, (0.0, ""))[0]:
                best[d] = (dice, e)
    path.write_text("".join(f"{d}\t{e}\n" for d, (_, e) in sorted(best.items())), encoding="utf-8")
    return len(best)


def glossary_terms(glossary: Glossary, sources: list[str], references: list[str]) -> list[list[Term]]:
    """Each sentence's glossary terms whose target word is in its reference."""
    found = []
    for source, reference in zip(sources, references, strict=True):
        terms = glossary.terms_for(source)
        found.append([t for t in terms if contains_term(reference, t.alternatives[0])])
    return found


def has_words(text: str, term: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(term)}(?!\w)", text) is not None


def inclusion(outputs: list[Translation], terms: list[list[Term]]) -> dict[str, float]:
    """Shares of constrained outputs meeting every term: by the search's account and as whole words."""
    constrained = [(out, t) for out, t in zip(outputs, terms, strict=True) if t]
    pieces = sum(not out.unmet for out, _ in constrained)
    words = sum(all(any(has_words(out.text, a) for a in term.alternatives) for term in t) for out, t in constrained)
    return {"lines": len(constrained), "piece_level": pieces / len(constrained), "word_level": words / len(constrained)}


def timed(translator: Translator, lines: list[str], beam: int, terms: list[list[Term]] | None) -> tuple[list[Translation], float]:
    start = time.perf_counter()
    found = translator.translate_nbest(lines, Decoding(beam=beam), constraints=terms)
    return [best[0] for best in found], time.perf_counter() - start


def evaluate_set(translator: Translator, lines: list[str], refs: list[str], terms: list[list[Term]], beam: int) -> dict:
    """A B A: unconstrained, constrained, unconstrained; inclusion and BLEU."""
    plain, first = timed(translator, lines, beam, None)
    constrained, seconds = timed(translator, lines, beam, terms)
    _, last = timed(translator, lines, beam, None)
    report = {
        "sentences": len(lines),
        "terms": sum(len(t) for t in terms),
        "inclusion": inclusion(constrained, terms),
        "bleu_without": bleu([t.text for t in plain], refs),
        "bleu_with": bleu([t.text for t in constrained], refs),
        "sentences_per_s_without": [len(lines) / first, len(lines) / last],
        "sentences_per_s_with": len(lines) / seconds,
    }
    report["speed_ratio"] = report["sentences_per_s_with"] / (sum(report["sentences_per_s_without"]) / 2)
    report["groups"] = groups(plain, constrained, refs, terms)
    return report


def groups(plain: list[Translation], constrained: list[Translation], refs: list[str], terms: list[list[Term]]) -> dict:
    """BLEU with and without constraints on lines the unconstrained output got right (had every term) or missed."""
    report = {}
    for name, wanted in (("right", True), ("missed", False)):
        rows = [
            n
            for n, t in enumerate(terms)
            if t and all(any(has_words(plain[n].text, a) for a in term.alternatives) for term in t) == wanted
        ]
        if rows:
            report[name] = {
                "lines": len(rows),
                "bleu_without": bleu([plain[n].text for n in rows], [refs[n] for n in rows]),
                "bleu_with": bleu([constrained[n].text for n in rows], [refs[n] for n in rows]),
            }
    return report


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, help="a trained German -> English Multi30k run (required but with --smoke)")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/multi30k"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=1000, help="test2016 sentences used (from the first)")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/terminology.json"))
    return common.parsed_with_model(parser, flag="-m/--model")


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny model (trained in `work` the first time) and the first lines of the tests' slice."""
    args.model, args.data, args.sentences = common.smoke_run(work), common.smoke_corpus(work), 10


def run_benchmark(args: argparse.Namespace) -> dict:
    """The n-gram set, then the glossary set, each A B A, with the matmul peak before and after."""
    translator = Translator.load(args.model, fast_paths=True)
    sources = read(args.data / "test_2016_flickr.de.gz")[: args.sentences]
    references = read(args.data / "test_2016_flickr.en.gz")[: args.sentences]
    translator.translate(sources[:16], beam=args.beam)  # warm-up
    device = getattr(translator.engine, "device", torch.device("cpu"))
    report: dict = {
        **common.smoke_label(args),
        "date": datetime.date.today().isoformat(),
        "model": str(args.model),
        "machine": common.machine_facts(),
        "device": str(device),
        "matmul_gflop_per_s": common.matmul_flops_per_s(device, smoke=args.smoke) / 1e9,
    }
    report["ngrams"] = evaluate_set(translator, sources, references, ngram_terms(references, args.seed), args.beam)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "glossary.tsv"
        report["glossary_entries"] = learn_glossary(read(args.data / "train.de.gz"), read(args.data / "train.en.gz"), path)
        terms = glossary_terms(Glossary.load(path), sources, references)
    kept = [n for n, t in enumerate(terms) if t]
    report["glossary"] = evaluate_set(
        translator, [sources[n] for n in kept], [references[n] for n in kept], [terms[n] for n in kept], args.beam
    )
    report["matmul_gflop_per_s_after"] = common.matmul_flops_per_s(device, smoke=args.smoke) / 1e9
    return report


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, run_benchmark, args.out)
    print_table(report)
    print(f"written to {args.out}")


def print_table(report: dict) -> None:
    print(f"matmul peak {report['matmul_gflop_per_s']:.0f} / {report['matmul_gflop_per_s_after']:.0f} GFLOP/s (before / after)")
    for name in ("ngrams", "glossary"):
        row = report[name]
        shares = row["inclusion"]
        without = " / ".join(f"{s:.1f}" for s in row["sentences_per_s_without"])
        print(
            f"{name:8} {row['sentences']} sentences, {row['terms']} terms: inclusion {100 * shares['piece_level']:.1f}% pieces, "
            f"{100 * shares['word_level']:.1f}% words; BLEU {row['bleu_without']:.2f} -> {row['bleu_with']:.2f}; "
            f"{without} -> {row['sentences_per_s_with']:.1f} sent/s ({row['speed_ratio']:.2f}x)"
        )
        for group, figures in row["groups"].items():
            bleus = f"BLEU {figures['bleu_without']:.2f} -> {figures['bleu_with']:.2f}"
            print(f"         {group:6} {figures['lines']} lines: {bleus}")


if __name__ == "__main__":
    main()
