"""A teacher and its students side by side: translation speed and quality on the same sentences.

    python -m benchmarks.distill --teacher RUN --student NAME=RUN [--student NAME=RUN ...] [--rounds 3]
        [--threads 0] [--output benchmarks/results/distill.json] [--smoke]

Translates the test split of the teacher's recipe (its saved config's data.test) with: the teacher on
the PyTorch engine at beam 5 (the reference) and greedy; each student greedy on the PyTorch engine
and on its CTranslate2 int8 export (exported to a temporary folder; export and loading are not
timed). The systems take turns for `--rounds` rounds (A B C A B C), each translating the whole
split; a system's sentences/s is its best round. For each: BLEU and chrF, the share of the teacher's
beam-5 BLEU, the speed as a multiple of the teacher's beam 5, and the problem flags of `mtkit
evaluate`. Prints a table with the fp32 matmul peak measured in the same run and writes JSON. Run it
on an otherwise idle machine. `--smoke`: the other smoke modes' tiny model as teacher and student.
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import common
from mtkit.data.corpora import iter_split
from mtkit.decoding.options import Decoding
from mtkit.decoding.translator import Translator
from mtkit.evaluation.metrics import bleu, chrf
from mtkit.evaluation.problems import FlagRules, flag_corpus, flag_counts
from mtkit.exporters.ctranslate2 import export_ctranslate2
from mtkit.runtime import set_threads


@dataclass
class System:
    """One way to translate: a model on an engine at a beam width, and its best round so far."""

    label: str
    translator: Translator
    beam: int
    seconds: float = float("inf")
    outputs: list[str] | None = None


def systems(teacher: Path, students: dict[str, Path], workdir: Path) -> list[System]:
    """The teacher at beam 5 and greedy; each student greedy on PyTorch and on its CTranslate2 int8 export."""
    found = [System("teacher pytorch beam5", Translator.load(teacher, device="cpu", fast_paths=True), 5)]
    found.append(System("teacher pytorch greedy", found[0].translator, 1))
    for name, run in students.items():
        exported = export_ctranslate2(run, workdir / name, quantization="int8")
        found.append(System(f"{name} pytorch greedy", Translator.load(run, device="cpu", fast_paths=True), 1))
        found.append(System(f"{name} ctranslate2-int8 greedy", Translator.load(exported, engine="ctranslate2"), 1))
    return found


def split_pairs(translator: Translator) -> tuple[list[str], list[str]]:
    """The sources and references of the test split of the model's recipe."""
    config = translator.config
    if config is None or not config.data.test:
        raise SystemExit("distill: the teacher's saved recipe names no data.test to translate")
    pairs = list(iter_split(config.data.test[0], config.src_lang, tgt_lang=config.tgt_lang, normalize=config.data.normalize))
    return [source for source, _ in pairs], [target for _, target in pairs]


def take_turns(found: list[System], sources: list[str], rounds: int) -> None:
    """Each system translates all `sources` once per round, in turns; each keeps its fastest round."""
    for _ in range(rounds):
        for system in found:
            start = time.perf_counter()
            best = system.translator.translate_nbest(sources, Decoding(beam=system.beam))
            system.seconds = min(system.seconds, time.perf_counter() - start)
            system.outputs = [hypotheses[0].text for hypotheses in best]


def rows(found: list[System], sources: list[str], references: list[str]) -> list[dict]:
    """Speed, quality and flags of each system, relative to the first (the teacher at beam 5)."""
    table = []
    for system in found:
        outputs = system.outputs or []
        table.append(
            {
                "system": system.label,
                "sentences_per_s": round(len(sources) / system.seconds, 1),
                "bleu": round(bleu(outputs, references), 2),
                "chrf": round(chrf(outputs, references), 2),
                "flags": flag_counts(flag_corpus(outputs, references, sources=sources, rules=FlagRules())),
            }
        )
    for row in table:
        row["speed_x_teacher_beam5"] = round(row["sentences_per_s"] / table[0]["sentences_per_s"], 2)
        row["bleu_share_of_teacher"] = round(row["bleu"] / max(table[0]["bleu"], 1e-9), 3)
    return table


def print_table(table: list[dict], peak: float) -> None:
    print(f"fp32 matmul peak {peak:.0f} GFLOP/s (measured before the runs)")
    print(f"{'system':<36} {'sent/s':>8} {'x beam5':>8} {'BLEU':>6} {'chrF':>6} {'share':>6}  flags")
    for row in table:
        flags = ", ".join(f"{name} {count}" for name, count in row["flags"].items() if count) or "none"
        print(
            f"{row['system']:<36} {row['sentences_per_s']:>8.1f} {row['speed_x_teacher_beam5']:>8.2f} "
            f"{row['bleu']:>6.2f} {row['chrf']:>6.2f} {row['bleu_share_of_teacher']:>6.1%}  {flags}"
        )


def measure(args: argparse.Namespace) -> dict:
    set_threads(args.threads)
    peak = common.matmul_gflop_per_s(smoke=args.smoke)
    students = dict(parse_student(item) for item in args.student)
    with tempfile.TemporaryDirectory() as workdir:
        found = systems(args.teacher, students, Path(workdir))
        sources, references = split_pairs(found[0].translator)
        take_turns(found, sources, args.rounds)
    table = rows(found, sources, references)
    print_table(table, peak)
    return {
        **common.smoke_label(args),
        "date": datetime.date.today().isoformat(),
        "machine": common.machine_facts(),
        "matmul_gflop_per_s": round(peak, 1),
        "teacher": str(args.teacher),
        "students": {name: str(run) for name, run in students.items()},
        "sentences": len(sources),
        "rounds": args.rounds,
        "rows": table,
    }


def parse_student(item: str) -> tuple[str, Path]:
    name, _, run = item.partition("=")
    if not run:
        raise SystemExit(f"distill: --student {item}: give NAME=RUN, e.g. --student student=runs/multi30k_student")
    return name, Path(run)


def tiny(args: argparse.Namespace, work: Path) -> None:
    """Smoke: the tiny model as the teacher and as the one student, one round."""
    run = common.smoke_run(work)
    args.teacher, args.student, args.rounds = run, [f"student={run}"], 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", type=Path, help="the teacher's run directory (or checkpoint)")
    parser.add_argument("--student", action="append", default=[], help="NAME=RUN of a student (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="turns each system takes (its best is kept)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core)")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/distill.json"))
    common.add_smoke_options(parser)
    args = parser.parse_args()
    if not args.smoke and (args.teacher is None or not args.student):
        parser.error("give --teacher RUN and at least one --student NAME=RUN (or --smoke)")
    common.measure_and_write(args, tiny, measure, args.output)


if __name__ == "__main__":
    main()
