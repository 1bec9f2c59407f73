"""Tag benchmark: inline tags through translation, on the tagged test set (benchmarks/tagged_set.py), three ways.

    python -m benchmarks.tags -m RUN_DIR [--set benchmarks/results/tagged_set.json] [--beam 5] [--sentences N]
        [--output benchmarks/results/tags.json] [--smoke]

The set's source document (NAME.source.html as tagged_set writes it: one <p> a caption) is translated
  (a) by mtkit's html format: read into blocks, `pipeline.translate_blocks` (one caption a block, --split-by lines),
      the tags placed over the words their source words align to, the document written back: aligned by eflomal
      with the run's word priors (`mtkit priors RUN`) when it has them, and again (mtkit_attention) by the model's
      attention;
  (b) with the tags stripped: the plain captions (what translating the untagged source gives);
  (c) naively: each caption's tagged HTML given to the model as text.
For (a) and (c): the share of captions whose output is well-formed (every tag closed in order, no stray closing
tag), the share of source tags found exactly once in the output, and placement: a tag's output words equal the
reference's tagged words after the same tokenisation (`tagged_set.TOKEN`, lowercased), over all tags and over the
tags whose reference words appear in the output; a softer overlap (F1 of the tagged tokens). BLEU of each way's
detagged output against the references, and (a)'s gap to (b). Placement against the reference itself: the
reference forced as the output's prefix, the spans placed over it by its alignments (placement alone, apart from
the translation's own errors). The time share of parsing, placeholders, tag placement and writing in (a), beam
`--beam`, the whole document being the page. `--smoke` (no -m or --set needed): the tiny model and the set built
on the tests' slice.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import html
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from benchmarks import common, tagged_set
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.documents import pipeline
from mtkit.documents.aligner import TagAligner, aligner_of
from mtkit.documents.blocks import Block, Span
from mtkit.documents.formats import DocumentLimits, format_named, read_document
from mtkit.documents.tags import markup, place_spans
from mtkit.evaluation.metrics import bleu
from mtkit.options import SplitBy

MARKUP = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9]*)\b[^>]*>")
PARAGRAPH = re.compile(r"<p>(.*?)</p>", re.DOTALL)
STAGE_STEPS = ("mask_placeholders", "place_spans", "space_placeholders")  # the pipeline's own work around translation


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fragment:
    """One caption's output HTML read back: its plain text, where each tag that opens and closes once lies in it,
    and whether its tags nest."""

    text: str
    tags: dict[str, tuple[int, int]]  # tag name -> character offsets into `text`
    counts: dict[str, int]  # tag name -> opening tags seen
    well_formed: bool


def read_fragment(fragment: str) -> Fragment:
    """The plain text and tags of a caption's HTML (entities decoded)."""
    pieces: list[str] = []
    size, stack, well_formed = 0, [], True
    opened: dict[str, int] = {}
    tags: dict[str, tuple[int, int]] = {}
    counts: collections.Counter[str] = collections.Counter()
    done = 0
    for match in MARKUP.finditer(fragment):
        piece = html.unescape(fragment[done : match.start()])
        pieces.append(piece)
        size += len(piece)
        done = match.end()
        closing, name = match.group(1) == "/", match.group(2).lower()
        if not closing:
            stack.append(name)
            counts[name] += 1
            opened[name] = size
        elif stack and stack[-1] == name:
            stack.pop()
            tags[name] = (opened[name], size)
        else:
            well_formed = False
    pieces.append(html.unescape(fragment[done:]))
    text = "".join(pieces)
    return Fragment(text=text, tags=tags, counts=dict(counts), well_formed=well_formed and not stack)


def words(text: str) -> list[str]:
    return [token.lower() for token in tagged_set.TOKEN.findall(text)]


def overlap(found: list[str], wanted: list[str]) -> float:
    """F1 of two token multisets."""
    common_count = sum((collections.Counter(found) & collections.Counter(wanted)).values())
    if not common_count:
        return 0.0
    precision, recall = common_count / len(found), common_count / len(wanted)
    return 2 * precision * recall / (precision + recall)


def tag_figures(fragments: Sequence[Fragment], rows: Sequence[dict]) -> dict:
    """Well-formed, kept and placement shares of one way's outputs against the set's rows."""
    kept = exact = present = exact_present = 0
    overlaps: list[float] = []
    for fragment, row in zip(fragments, rows, strict=True):
        for tag in row["tags"]:
            wanted = words(row["reference"][slice(*tag["reference"])])
            where = fragment.tags.get(tag["name"])
            found = words(fragment.text[slice(*where)]) if where is not None else []
            once = where is not None and fragment.counts.get(tag["name"]) == 1
            kept += once
            exact += once and found == wanted
            overlaps.append(overlap(found, wanted) if once else 0.0)
            if contains(words(fragment.text), wanted):
                present += 1
                exact_present += once and found == wanted
    tags = sum(len(row["tags"]) for row in rows)
    return {
        "well_formed": sum(fragment.well_formed for fragment in fragments) / len(fragments),
        "tags_kept": kept / tags,
        "placement_exact": exact / tags,
        "placement_exact_where_words_present": exact_present / present if present else None,
        "tags_whose_words_are_present": present,
        "placement_overlap_f1": sum(overlaps) / tags,
    }


def contains(haystack: list[str], needle: list[str]) -> bool:
    return any(haystack[start : start + len(needle)] == needle for start in range(len(haystack) - len(needle) + 1))


@contextlib.contextmanager
def timed_calls(module: object, name: str, seconds: dict[str, float]) -> Iterator[None]:
    """`module.name` timed while inside: its calls' seconds added to `seconds[name]`."""
    function: Callable = getattr(module, name)
    seconds.setdefault(name, 0.0)

    def timed(*args, **kwargs):  # the wrapped function's own signature
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - start

    setattr(module, name, timed)
    try:
        yield
    finally:
        setattr(module, name, function)


def mtkit_way(translator: Translator, document_text: str, decoding: Decoding) -> tuple[list[str], dict[str, float]]:
    """The source document through the html format and the pipeline: each caption's output HTML, and the seconds
    of each step."""
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    document = read_document(format_named("html"), document_text, name="source.html", limits=DocumentLimits())
    seconds["parse"] = time.perf_counter() - start
    with contextlib.ExitStack() as timing:
        for name in STAGE_STEPS:
            timing.enter_context(timed_calls(pipeline, name, seconds))
        timing.enter_context(timed_calls(TagAligner, "links", seconds))
        start = time.perf_counter()
        translated = pipeline.translate_blocks(translator, document.blocks, decoding=decoding, split_by=SplitBy.LINES)
        seconds["blocks"] = time.perf_counter() - start
    start = time.perf_counter()
    written = document.render(translated)
    seconds["render"] = time.perf_counter() - start
    return PARAGRAPH.findall(written), seconds


def time_shares(seconds: dict[str, float]) -> dict:
    """Each step's seconds, and the share of the stage's own work (parse, mask, place, render) in the whole."""
    overhead = seconds["parse"] + sum(seconds[name] for name in (*STAGE_STEPS, "links")) + seconds["render"]
    whole = seconds["parse"] + seconds["blocks"] + seconds["render"]
    return {**{name: round(value, 4) for name, value in seconds.items()}, "stage_share": overhead / whole}


def forced_placement(translator: Translator, rows: Sequence[dict], decoding: Decoding, aligner: TagAligner | None) -> dict:
    """Placement with the reference forced as the output: the tags placed over it by `aligner` (else the model's
    alignments), against the set's spans (tags not placed on the reference's words count as misses)."""
    blocks = [source_block(row) for row in rows]
    aligned = dataclasses.replace(decoding, alignments=True)
    found = translator.translate_nbest([block.text for block in blocks], aligned, prefixes=[row["reference"] for row in rows])
    links = aligner.links([(b.text, best[0].text) for b, best in zip(blocks, found, strict=True)]) if aligner else None
    fragments = []
    for n, (block, best) in enumerate(zip(blocks, found, strict=True)):
        placed = place_spans(block, best[0], token_links=links[n] if links is not None else None)
        fragments.append(read_fragment(render_html(placed)))
    figures = tag_figures(fragments, rows)
    return {key: figures[key] for key in ("tags_kept", "placement_exact", "placement_overlap_f1")}


def source_block(row: dict) -> Block:
    """A caption and its tags as the html format reads them (its spans: the set's tags over the source)."""
    spans = sorted((Span(start=t["source"][0], end=t["source"][1], open=t["open"], close=t["close"]) for t in row["tags"]),
                   key=lambda span: (span.start, -span.end))  # fmt: skip
    return Block(text=row["source"], spans=tuple(spans))


def render_html(block: Block) -> str:
    """A block as HTML text: its spans' markup around its escaped text, as the html format writes it."""
    return markup(block, escape=lambda text: html.escape(text, quote=False))


def run_benchmark(args: argparse.Namespace) -> dict:
    """The three ways, their figures, forced-reference placement and the stage's time share."""
    translator = Translator.load(args.model)
    rows = json.loads(args.set.read_text(encoding="utf-8"))["rows"][: args.sentences]
    lines = [tagged_set.tagged_line(row["source"], [(t["open"], t["close"], t["source"]) for t in row["tags"]]) for row in rows]
    document_text = tagged_set.html_document(lines, "Multi30k test2016, tagged (source)")  # NAME.source.html's first lines
    references = [row["reference"] for row in rows]
    decoding = Decoding(beam=args.beam)
    translator.translate_nbest([row["source"] for row in rows[:16]], decoding)  # warm-up
    aligner = aligner_of(translator.directory)  # the run's word priors (`mtkit priors`), if it has them
    outputs, seconds = mtkit_way(translator, document_text, decoding)
    if len(outputs) != len(rows):
        raise SystemExit(f"tags: {len(outputs)} paragraphs came back for {len(rows)} captions")
    mtkit = [read_fragment(output) for output in outputs]
    directory, translator.directory = translator.directory, None  # the model's attention places the tags
    attention = [read_fragment(output) for output in mtkit_way(translator, document_text, decoding)[0]]
    translator.directory = directory
    stripped = [best[0].text for best in translator.translate_nbest([row["source"] for row in rows], decoding)]
    naive = [read_fragment(best[0].text) for best in translator.translate_nbest(lines, decoding)]
    report = {
        **common.smoke_label(args),
        "date": datetime.date.today().isoformat(),
        "model": str(args.model),
        "set": str(args.set),
        "machine": common.machine_facts(),
        "beam": args.beam,
        "sentences": len(rows),
        "tags": sum(len(row["tags"]) for row in rows),
        "ways": {
            "mtkit": {**tag_figures(mtkit, rows), "bleu": bleu([f.text for f in mtkit], references)},
            "mtkit_attention": {**tag_figures(attention, rows), "bleu": bleu([f.text for f in attention], references)},
            "stripped": {"tags_kept": 0.0, "bleu": bleu(stripped, references)},
            "naive": {**tag_figures(naive, rows), "bleu": bleu([f.text for f in naive], references)},
        },
        "aligner": "eflomal with the run's word priors" if aligner is not None else "the model's attention",
        "forced_reference": forced_placement(translator, rows, decoding, aligner),
        "time": time_shares(seconds),
    }
    report["bleu_gap_to_stripped"] = report["ways"]["mtkit"]["bleu"] - report["ways"]["stripped"]["bleu"]
    return report


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, help="a German -> English Multi30k run (required but with --smoke)")
    parser.add_argument("--set", type=Path, default=Path("benchmarks/results/tagged_set.json"), help="tagged_set's JSON")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=None, help="the set's first captions only (default: all)")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/tags.json"))
    return common.parsed_with_model(parser, flag="-m/--model")


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny model (trained in `work` the first time) and the set built on the tests' slice."""
    args.model = common.smoke_run(work)
    args.set = work / "tags_set.json"
    built = argparse.Namespace(data=common.smoke_corpus(work), seed=1, output=args.set, smoke=True)
    common.write_json(args.set, tagged_set.build(built))


def print_table(report: dict) -> None:
    print(f"{report['sentences']} captions, {report['tags']} tags, beam {report['beam']}")
    for name, row in report["ways"].items():
        figures = [f"BLEU {row['bleu']:.2f}", f"tags kept {100 * row['tags_kept']:.1f}%"]
        if "well_formed" in row:
            figures.insert(0, f"well-formed {100 * row['well_formed']:.1f}%")
            figures.append(f"placement {100 * row['placement_exact']:.1f}% (overlap F1 {row['placement_overlap_f1']:.2f})")
        print(f"{name:9} " + ", ".join(figures))
    forced = report["forced_reference"]
    print(f"tags placed by {report['aligner']}")
    print(f"reference forced: placement {100 * forced['placement_exact']:.1f}% (overlap F1 {forced['placement_overlap_f1']:.2f})")
    gap, share = report["bleu_gap_to_stripped"], 100 * report["time"]["stage_share"]
    print(f"BLEU gap to the stripped way {gap:+.2f}; the stage's time share {share:.1f}%")


def main() -> None:
    args = parse_args()
    report = common.measure_and_write(args, tiny_arguments, run_benchmark, args.output)
    print_table(report)
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
