"""Placeholders kept: are the printf, Python, brace, ICU, URL and e-mail placeholders of software strings restored?

    python -m benchmarks.placeholders [-m runs/multi30k_demo] [--out benchmarks/results/placeholders.json] [--smoke]

Multi30k test2016's German sources, each with one or two placeholders of the styles below inserted at word
boundaries drawn with a fixed seed, are written as the msgids of a gettext PO file and translated as a user would,
`mtkit translate --format po` (placeholders masked, put back by the model's alignments), and, beside it, the same
lines as plain text (`--format text --split-by lines`: the model sees the placeholders). A placeholder is restored
when the translation holds it exactly as often as its source; the report counts them per style, and the lines
with every placeholder restored. `--smoke`: the tiny model and the test lines of the tests' own slice.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import platform
import random
from pathlib import Path

from translate.storage import pypo

from benchmarks import common
from benchmarks.common import MtkitCommands

DATA = Path("../shared/data/multi30k")
STYLES = {
    "printf": "%s",
    "printf_number": "%d",
    "printf_positional": "%1$s",
    "python_named": "%(name)s",
    "brace_index": "{0}",
    "brace_name": "{name}",
    "double_brace": "{{user}}",
    "icu_plural": "{count, plural, one {# Bild} other {# Bilder}}",
    "url": "https://example.org/bilder?id=42",
    "email": "hilfe@example.org",
}
SEED = 2016


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, default=Path("runs/multi30k_demo"), help="a German -> English run")
    parser.add_argument("--src", type=Path, default=DATA / "test_2016_flickr.de.gz")
    parser.add_argument("--out", "--output", type=Path, default=Path("benchmarks/results/placeholders.json"))
    parser.add_argument("--work", type=Path, default=Path("benchmarks/results/placeholders"), help="files written here")
    common.add_smoke_options(parser)
    return parser.parse_args()


def tiny_arguments(args: argparse.Namespace, work: Path) -> None:
    """--smoke: the tiny model and its test lines."""
    args.model = common.smoke_run(work)
    args.src, args.work = common.smoke_corpus(work) / "test_2016_flickr.de.gz", work / "placeholders"


def with_placeholders(lines: list[str], seed: int = SEED) -> list[tuple[str, list[str]]]:
    """Each line with one or two placeholders (the styles in turn) inserted at drawn word boundaries, and their styles."""
    draw = random.Random(seed)
    styles = list(STYLES)
    placed = []
    for number, line in enumerate(lines):
        words = line.split()
        chosen = [styles[(2 * number + offset) % len(styles)] for offset in range(draw.choice((1, 2)))]
        for style in chosen:
            words.insert(draw.randint(0, len(words)), STYLES[style])
        placed.append((" ".join(words), chosen))
    return placed


def po_file(sources: list[str], path: Path) -> Path:
    """A PO file with each source a msgid, written by translate-toolkit."""
    store = pypo.pofile()
    store.updateheader(add=True, Language="en", Content_Type="text/plain; charset=UTF-8")
    for source in sources:
        store.addsourceunit(source)
    path.write_bytes(bytes(store))
    return path


def restored(pairs: list[tuple[tuple[str, list[str]], str]]) -> dict:
    """Per style, the placeholders found as often in the translation as in the source; the lines with all of them."""
    counts = {style: {"restored": 0, "placed": 0} for style in STYLES}
    whole = 0
    for (source, styles), translation in pairs:
        kept = [translation.count(STYLES[style]) == source.count(STYLES[style]) for style in styles]
        for style, ok in zip(styles, kept, strict=True):
            counts[style]["placed"] += 1
            counts[style]["restored"] += ok
        whole += all(kept)
    total = {key: sum(row[key] for row in counts.values()) for key in ("restored", "placed")}
    return {"lines": len(pairs), "lines_all_restored": whole, **total, "styles": counts}


def measure(args: argparse.Namespace) -> dict:
    """The test lines with placeholders, translated as a PO file and as plain text, their placeholders counted."""
    commands = MtkitCommands(in_process=args.smoke)
    args.work.mkdir(parents=True, exist_ok=True)
    lines = gzip.decompress(args.src.read_bytes()).decode("utf-8").splitlines()
    placed = with_placeholders(lines)
    sources = [source for source, _ in placed]
    source_po, translated_po = po_file(sources, args.work / "test2016.de.po"), args.work / "test2016.en.po"
    commands.run(["translate", "-m", args.model, "-i", source_po, "-o", translated_po, "--format", "po"])
    entries = [unit.target for unit in pypo.pofile.parsestring(translated_po.read_bytes()).units if not unit.isheader()]
    source_text, translated_text = args.work / "test2016.de.txt", args.work / "test2016.en.txt"
    source_text.write_text("".join(f"{source}\n" for source in sources), encoding="utf-8")
    commands.run(["translate", "-m", args.model, "-i", source_text, "-o", translated_text, "--split-by", "lines"])
    plain = translated_text.read_text(encoding="utf-8").splitlines()
    rows = {
        "po_masked": restored(list(zip(placed, entries, strict=True))),
        "text_unmasked": restored(list(zip(placed, plain, strict=True))),
    }
    for name, row in rows.items():
        print(f"{name:<14} {row['restored']}/{row['placed']} placeholders restored, "
              f"{row['lines_all_restored']}/{row['lines']} lines with all")  # fmt: skip
    return {
        **common.smoke_label(args),
        "date": datetime.date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
        "model": str(args.model),
        "test": str(args.src),
        "seed": SEED,
        "placeholders": STYLES,
        "rows": rows,
        **common.machine_facts(),
    }


def main() -> None:
    args = parse_args()
    common.measure_and_write(args, tiny_arguments, measure, args.out)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
