"""The `mtkit` command line: one thin command per stage, each calling one library function.

Heavy modules (torch, datasets) are imported inside the commands so `mtkit --help` is instant.
A user mistake (`MtkitError`, or a bad option value) is printed as one line on stderr with exit status 2.
"""

from __future__ import annotations

import atexit
import gc
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from typer.core import TyperGroup

from mtkit.decoding.options import SEED_LIMIT, Decoding, FileOptions, Sampling, ShortlistBuild
from mtkit.documents.formats import FORMATS
from mtkit.errors import MtkitError
from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.problems import parse_rules
from mtkit.evaluation.significance import PairedTests
from mtkit.options import (
    BadBytes,
    CometPrecision,
    ConstraintOrder,
    EngineName,
    ExportFormat,
    MbrUtility,
    QualityMetric,
    Quantization,
    RerankMethod,
    Split,
    SplitBy,
)
from mtkit.run_files import RunFiles
from mtkit.serving.limits import CPU_BATCH_LINES, CPU_WORKERS, HOST, OTHER_BATCH_LINES, ServeLimits

if TYPE_CHECKING:
    from mtkit.decoding.translator import Translator
    from mtkit.evaluation.rerank import Reranker  # loads torch: imported by the command that uses it

# Typer raises its own copy of click's UsageError (the base of typer.BadParameter) for bad option values.
_UsageError = next(base for base in typer.BadParameter.__mro__ if base.__name__ == "UsageError")


class _Group(TyperGroup):
    """Turns `MtkitError` and a command's usage errors (a bad option value, an unknown option) into
    one line on stderr and exit status 2, never a traceback."""

    def invoke(self, ctx: typer.Context):  # noqa: ANN201 - click's signature
        try:
            return super().invoke(ctx)
        except MtkitError as err:
            typer.echo(f"mtkit: error: {err}", err=True)
            raise typer.Exit(2) from None
        except _UsageError as err:
            command = err.ctx.command_path if err.ctx is not None else "mtkit"
            message = " ".join(err.format_message().split()).rstrip(".")
            typer.echo(f"mtkit: error: {message}; see '{command} --help'", err=True)
            raise typer.Exit(2) from None


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="mtkit: neural machine translation from raw parallel text to a scored model.",
)
tokenizer_app = typer.Typer(cls=_Group, no_args_is_help=True, help="SentencePiece tokenizers.")
app.add_typer(tokenizer_app, name="tokenizer")
import_app = typer.Typer(cls=_Group, no_args_is_help=True, help="Models trained elsewhere, as mtkit run directories.")
app.add_typer(import_app, name="import")

DECODING = Decoding()  # a call's decoding defaults (None: the recipe's), stated once
SAMPLING = Sampling()  # sampling's defaults, stated once
FILE_OPTIONS = FileOptions()  # translate's file defaults, stated once
SHORTLIST = ShortlistBuild()  # mtkit shortlist's defaults, stated once

Recipe = Annotated[Path, typer.Argument(help="YAML recipe, e.g. recipes/multi30k/transformer.yaml.")]
Overrides = Annotated[
    Optional[list[str]], typer.Option("--set", help="Override a recipe key: --set train.max_steps=100 (repeatable).")
]
ModelPath = Annotated[Path, typer.Option("--model", "-m", help="Run directory (uses best.pt, else last.pt) or checkpoint file.")]
TranslateModels = Annotated[
    list[Path],
    typer.Option(
        "--model",
        "-m",
        help="Run directory (best.pt, else last.pt), checkpoint or `mtkit export` directory; repeat for an ensemble.",
    ),
]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
TgtLang = Annotated[
    Optional[str],
    typer.Option(
        help="The language to translate into, for a model of several (data.lang_tag: target), or the target's code for "
        "an imported NLLB-200, M2M-100 or mBART-50 model (deu_Latn; de where it names one code)."
    ),
]
SrcLang = Annotated[
    Optional[str],
    typer.Option(
        help="The source's language code, for an imported NLLB-200, M2M-100 or mBART-50 model (deu_Latn; de where it "
        "names one code; default: the recipe's src_lang)."
    ),
]
InitFrom = Annotated[
    Optional[Path],
    typer.Option(
        help="Fine-tune: start from this run directory or checkpoint (its weights, architecture, tokenizers); train.init_from."
    ),
]
PrefixFile = Annotated[
    Optional[Path], typer.Option(help="File of target prefixes, one per input line (empty: none); outputs start with them.")
]
Nbest = Annotated[
    int, typer.Option(min=1, help="Print the N best translations (or N samples) per line, tab-separated with scores.")
]
Temperature = Annotated[float, typer.Option(help="With --sampling: divide the logits by T (below 1: sharper).")]
SamplingSeed = Annotated[
    int, typer.Option(min=0, max=SEED_LIMIT, help="With --sampling: the same seed gives the same samples (0 to 2^64-1).")
]
BadBytesOption = Annotated[BadBytes, typer.Option(help="error: stop at bytes that are not UTF-8; replace: replace, and warn.")]
PlotAttention = Annotated[Optional[Path], typer.Option(help="Write an attention heatmap PNG per sentence into this directory.")]
PlotCount = Annotated[int, typer.Option(min=1, help="With --plot-attention: plot the first N input lines.")]
PlotHeads = Annotated[bool, typer.Option(help="With --plot-attention: one panel per head instead of their mean.")]
NoRepeatNgram = Annotated[int, typer.Option(min=0, help="No N-gram may appear twice in an output (0: off).")]
AlignmentLayer = Annotated[int, typer.Option(help="With --alignments: the decoder layer to align with (-1: last).")]
EngineOption = Annotated[EngineName, typer.Option(help="auto: CTranslate2 for an `mtkit export` directory, else PyTorch.")]
BufferLines = Annotated[int, typer.Option(min=1, help="Input lines read and translated together; output follows each window.")]
ConstraintsFile = Annotated[
    Optional[Path],
    typer.Option(help='Terms each translation must contain: one JSON list per input line, e.g. ["Rad", ["Hund", "Hunde"]].'),
]
ConstraintsOrder = Annotated[ConstraintOrder, typer.Option(help="any: the terms in any order; given: in the order of the list.")]
GlossaryFile = Annotated[
    Optional[Path], typer.Option(help="TSV of source term TAB target term(s): a line holding a source term gets its target term.")
]
SamplingOption = Annotated[
    Optional[str], typer.Option(help="Sample instead of searching: topk:K, topp:P or full (with --temperature, --seed).")
]
ShortlistOption = Annotated[
    Optional[bool],
    typer.Option(
        "--shortlist/--no-shortlist",
        help="Search over the run's vocabulary shortlist (`mtkit shortlist RUN`); default: on when the model has one.",
    ),
]
DocumentFormatOption = Annotated[
    str,
    typer.Option(
        "--format",
        help="The input's format, written back in the same one: " + "; ".join(f"{r.name}: {r.help}" for r in FORMATS.values()),
    ),
]
Retranslate = Annotated[
    bool,
    typer.Option(
        help=f"With --format {' or '.join(r.name for r in FORMATS.values() if r.units)}: translate the entries translated "
        "already too (else they are kept).",
    ),
]
SplitByOption = Annotated[
    Optional[SplitBy],
    typer.Option(
        help="sentences: a paragraph cut into sentences, translated, rebuilt with its spacing; lines: each line whole "
        "(default: the recipe's decode.split_by, sentences)."
    ),
]
Alignments = Annotated[
    bool, typer.Option(help="Append, after a tab, Pharaoh word alignments i-j (source word i, target word j).")
]
Rerank = Annotated[
    Optional[RerankMethod],
    typer.Option(help="Choose each line's translation among --candidates: qe (a COMET-QE model's best) or mbr (the consensus)."),
]
Candidates = Annotated[
    Optional[int], typer.Option(help="With --rerank: translations to choose among, a beam's n-best (up to --beam) or N samples.")
]
MbrUtilityOption = Annotated[
    Optional[MbrUtility], typer.Option(help="With --rerank mbr: how candidates agree, by sentence chrF (default) or COMET.")
]
RerankCometModel = Annotated[
    Optional[str], typer.Option(help="With --rerank qe or --mbr-utility comet: a COMET folder or hub id (docs/evaluation.md).")
]
ServeCometModel = Annotated[
    Optional[str], typer.Option(help="The COMET model of requests' rerank qe (or mbr_utility comet): a folder or hub id.")
]
RerankCometEncoder = Annotated[
    Optional[Path], typer.Option(help="With --comet-model, offline: a folder with its encoder's config.json and tokenizer.")
]


def _config(recipe: Path, overrides: list[str] | None, init_from: Path | None = None):
    from mtkit.config import load_config

    parent = [f"train.init_from={json.dumps(str(init_from))}"] if init_from is not None else []
    return load_config(recipe, [*(overrides or []), *parent])


@tokenizer_app.command("train")
def tokenizer_train_command(recipe: Recipe, overrides: Overrides = None) -> None:
    """Train SentencePiece (BPE or unigram) on the training text, joint or one model per side."""
    config = _config(recipe, overrides)  # the whole recipe is checked before torch is even imported
    from mtkit.training.run_data import train_run_tokenizers

    for line in train_run_tokenizers(config, str(recipe)).lines():
        typer.echo(line)


@app.command("prepare")
def prepare_command(
    recipe: Recipe,
    overrides: Overrides = None,
    init_from: InitFrom = None,
    extend_vocab: Annotated[
        int, typer.Option(help="With train.init_from: add the pieces of an N-piece vocabulary learnt from the new data.")
    ] = 0,
    device: Annotated[
        str, typer.Option(help="Where models write synthetic corpora and filter pairs: auto, cpu, cuda or cuda:N.")
    ] = "auto",
) -> None:
    """Read, normalise, clean, encode and store every split as memory-mapped Arrow data. A synthetic corpus
    (translate_with, back_translate_with) is first written by its model, once: it is cached in the data directory.
    Under `torchrun --nproc_per_node N -m mtkit prepare`, N processes share that translation."""
    config = _config(recipe, overrides, init_from)  # the whole recipe is checked before torch is even imported
    from mtkit.training.run_data import prepare_run_data

    for line in prepare_run_data(config, extend_vocab=extend_vocab, device=device, fast_paths=True).lines():
        typer.echo(line)


@app.command("train")
def train_command(
    recipe: Recipe,
    overrides: Overrides = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in run_dir from last.pt.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Start again, replacing the run in run_dir.")] = False,
    init_from: InitFrom = None,
) -> None:
    """Train the recipe's model; checkpoints, config and log.jsonl go to run_dir."""
    config = _config(recipe, overrides, init_from)  # the whole recipe is checked before torch is even imported
    from mtkit.training.trainer import train

    train(config, resume=resume, overwrite=overwrite)


@app.command("translate")
def translate_command(
    model: TranslateModels,
    input: Annotated[Optional[Path], typer.Option("--input", "-i", help="Input file (default: stdin).")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output file (default: stdout).")] = None,
    beam: Annotated[Optional[int], typer.Option(min=1, help="Beam size; 1 is greedy (default: the recipe's).")] = None,
    nbest: Nbest = DECODING.nbest,
    length_penalty: Annotated[Optional[float], typer.Option(help="Score / length**alpha (default: the recipe's).")] = None,
    prefix: PrefixFile = None,
    sampling: SamplingOption = None,
    temperature: Temperature = SAMPLING.temperature,
    seed: SamplingSeed = SAMPLING.seed,
    no_repeat_ngram: NoRepeatNgram = DECODING.no_repeat_ngram,
    alignments: Alignments = DECODING.alignments,
    alignment_layer: AlignmentLayer = DECODING.alignment_layer,
    bad_bytes: BadBytesOption = FILE_OPTIONS.bad_bytes,
    plot_attention: PlotAttention = None,
    plot_count: PlotCount = FILE_OPTIONS.plot_count,
    plot_heads: PlotHeads = FILE_OPTIONS.plot_heads,
    engine: EngineOption = EngineName.AUTO,
    device: Device = "auto",
    buffer_lines: BufferLines = FILE_OPTIONS.buffer_lines,
    constraints: ConstraintsFile = None,
    constraints_order: ConstraintsOrder = ConstraintOrder.of(in_order=DECODING.constraints_in_order),
    glossary: GlossaryFile = None,
    tgt_lang: TgtLang = None,
    rerank: Rerank = None,
    candidates: Candidates = None,
    mbr_utility: MbrUtilityOption = None,
    comet_model: RerankCometModel = None,
    comet_encoder: RerankCometEncoder = None,
    src_lang: SrcLang = None,
    document_format: DocumentFormatOption = "text",
    split_by: SplitByOption = None,
    retranslate: Retranslate = False,
    shortlist: ShortlistOption = DECODING.shortlist,
) -> None:
    """Translate text: one output line per input line, in order, each window written when done (torchrun: N processes)."""
    from mtkit.distributed import distributed_translation
    from mtkit.documents.files import DocumentOptions, translate_document_file

    reranker, nbest = _reranker(rerank, candidates=candidates, utility=mbr_utility, model=comet_model, encoder=comet_encoder,
                                device=device, nbest=nbest)  # fmt: skip
    decoding = Decoding(beam=beam, nbest=nbest, length_penalty=length_penalty, sampling=_drawn(sampling, temperature, seed),
        no_repeat_ngram=no_repeat_ngram, alignments=alignments, alignment_layer=alignment_layer, tgt_lang=tgt_lang,
        constraints_in_order=constraints_order is ConstraintOrder.GIVEN, src_lang=src_lang, shortlist=shortlist)  # fmt: skip
    document = DocumentOptions(format=document_format, split_by=split_by, retranslate=retranslate, file=FileOptions(input=input,
        output=output, decoding=decoding, prefix=prefix, bad_bytes=bad_bytes, plot_attention=plot_attention, glossary=glossary,
        plot_count=plot_count, plot_heads=plot_heads, buffer_lines=buffer_lines, constraints=constraints))  # fmt: skip
    with distributed_translation(device) as (distributed, rank_device):
        translate_document_file(_translator(model, engine, rank_device), document, distributed=distributed, chooser=reranker)


def _drawn(sampling: str | None, temperature: float, seed: int) -> Sampling | None:
    """--sampling with its --temperature and --seed (None: search)."""
    return Sampling.parse(sampling, temperature, seed=seed) if sampling is not None else None


def _translator(model: list[Path], engine: EngineName, device: object) -> Translator:
    """The translator `translate` runs: the model on this rank's device, its large linears packed."""
    from mtkit.decoding.translator import Translator

    return Translator.load(model, engine, device=str(device), fast_paths=True)


def _reranker(
    method: RerankMethod | None,
    *,
    candidates: int | None,
    utility: MbrUtility | None,
    model: str | None,
    encoder: Path | None,
    device: str,
    nbest: int,
) -> tuple[Reranker | None, int]:
    """`--rerank` and its options: the reranker (its COMET model loaded, None without --rerank), and the number of
    translations to search for each line (its candidates, else --nbest)."""
    from mtkit.evaluation.rerank import Reranker, RerankOptions

    comet = CometOptions(model=model, encoder=encoder, device=device) if model is not None else None
    options = RerankOptions(method=method and method.value, candidates=candidates, utility=utility and utility.value, comet=comet)
    reranker = Reranker.load(options, nbest=nbest)
    return reranker, reranker.candidates if reranker is not None else nbest


@app.command("score")
def score_command(
    model: TranslateModels,
    src: Annotated[Path, typer.Option(help="Source sentences, one per line.")],
    tgt: Annotated[Path, typer.Option(help="Their translations to score, one per line.")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output file (default: stdout).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of tab-separated columns.")] = False,
    engine: EngineOption = EngineName.AUTO,
    device: Device = "auto",
    tgt_lang: TgtLang = None,
    src_lang: SrcLang = None,
) -> None:
    """Score given translations: per pair, the total log-probability, its per-token average and the token count."""
    from mtkit.decoding.files import score_files
    from mtkit.decoding.translator import Translator
    from mtkit.runtime import resolve_device

    translator = Translator.load(model, engine, device=str(resolve_device(device)), fast_paths=True)
    truncated = score_files(translator, src, tgt=tgt, output=output, as_json=as_json, tgt_lang=tgt_lang, src_lang=src_lang)
    if truncated:
        typer.echo(
            f"mtkit: warning: {len(truncated)} pairs (lines {', '.join(map(str, truncated[:5]))}"
            f"{', ...' if len(truncated) > 5 else ''}) were longer than the model's positions and were scored truncated",
            err=True,
        )


# What `mtkit shortlist` and `mtkit priors` align: the run's prepared training pairs, or a corpus given
AlignedLines = Annotated[int, typer.Option("--lines", min=1, help="Training pairs aligned at most (a seeded sample).")]
AlignedSrc = Annotated[
    Optional[Path],
    typer.Option("--src", help="With --tgt: a parallel corpus to align instead of the run's prepared training data."),
]
AlignedTgt = Annotated[Optional[Path], typer.Option("--tgt", help="With --src: its translations, one per line.")]


@app.command("shortlist")
def shortlist_command(
    run: Annotated[Path, typer.Argument(help="Run directory whose vocabulary shortlist to build.")],
    k: Annotated[int, typer.Option(min=1, help="Target pieces kept per source piece (by alignment counts).")] = SHORTLIST.k,
    frequent: Annotated[
        int, typer.Option(min=0, help="The most frequent target pieces, kept in every batch.")
    ] = SHORTLIST.frequent,
    lines: AlignedLines = SHORTLIST.lines,
    src: AlignedSrc = None,
    tgt: AlignedTgt = None,
) -> None:
    """Build RUN/shortlist.safetensors from eflomal word alignments: per source piece its K likeliest target pieces.
    translate, evaluate and serve then compute only those rows of the output layer (--no-shortlist: all)."""
    from mtkit.decoding.shortlist import build_shortlist, describe

    shortlist = build_shortlist(run, ShortlistBuild(k=k, frequent=frequent, lines=lines, src=src, tgt=tgt))
    path = RunFiles.of(run).shortlist
    shortlist.save(path)
    typer.echo(describe(shortlist, path), err=True)


@app.command("priors")
def priors_command(
    run: Annotated[Path, typer.Argument(help="Run directory whose word-alignment priors to build.")],
    lines: AlignedLines = SHORTLIST.lines,
    src: AlignedSrc = None,
    tgt: AlignedTgt = None,
) -> None:
    """Build what the documents stage learns from the run's training corpus. RUN/word_priors.txt: eflomal's
    word-alignment priors; translate, evaluate and serve then place the inline tags of a document (--format html,
    xml, markdown, xliff) by eflomal's alignment of each sentence with its translation, guided by them, instead of the
    model's attention. RUN/sentence_ends.tsv: which words end and start the corpus's sentences; --split-by sentences
    then also cuts a paragraph where a sentence ends without punctuation."""
    from mtkit.decoding.shortlist import build_word_priors, corpus_texts
    from mtkit.documents.aligner import save_priors
    from mtkit.documents.sentence_ends import SentenceEnds, save_sentence_ends

    files = RunFiles.of(run)
    sources, targets = corpus_texts(run, ShortlistBuild(lines=lines, src=src, tgt=tgt))
    ends = SentenceEnds.learn(sources, info={"lines": len(sources)})
    save_sentence_ends(files.sentence_ends, ends)
    typer.echo(f"{files.sentence_ends}: word pairs of {len(sources)} sentences, {len(ends.pairs)} lines", err=True)
    typer.echo(f"mtkit priors: aligning {len(sources)} pairs with eflomal", err=True)
    priors, info = build_word_priors(sources, targets)
    save_priors(files.word_priors, priors, info=info)
    typer.echo(f"{files.word_priors}: priors of {info['lines']} pairs, {priors.count(chr(10))} lines", err=True)


LIMITS = ServeLimits()  # the server's defaults, stated once
BatchLines = Annotated[
    int,
    typer.Option(min=0, help=f"Sentences merged into a batch at most (0: {CPU_BATCH_LINES} on CPU, else {OTHER_BATCH_LINES})."),
]


@app.command("serve")
def serve_command(
    model: TranslateModels,
    host: Annotated[str, typer.Option(help="Address to bind; 0.0.0.0 serves other machines too.")] = HOST,
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    max_wait_ms: Annotated[float, typer.Option(min=0, help="How long the worker waits to fill a batch.")] = LIMITS.max_wait_ms,
    max_queue: Annotated[
        int, typer.Option(min=1, help="Requests waiting at most; more get 503 with Retry-After.")
    ] = LIMITS.max_queue,
    max_lines: Annotated[int, typer.Option(min=1, help="Sentences per request at most (413 above).")] = LIMITS.max_lines,
    max_chars: Annotated[int, typer.Option(min=1, help="Characters per request at most (413 above).")] = LIMITS.max_chars,
    batch_lines: BatchLines = LIMITS.batch_lines,
    workers: Annotated[
        int, typer.Option(min=0, help=f"Decoding threads, each on its share of the cores (0: {CPU_WORKERS} on CPU).")
    ] = LIMITS.workers,
    max_work: Annotated[
        int, typer.Option(min=1, help="Decoding steps x beam, and reranking, one request may take at most (413 above).")
    ] = LIMITS.max_work,
    max_output_steps: Annotated[
        int, typer.Option(min=1, help="Decoding steps one sentence may take at most: its output cap or prefix (413 above).")
    ] = LIMITS.max_output_steps,
    max_reranks: Annotated[int, typer.Option(min=1, help="Requests reranking at once (more: 503).")] = LIMITS.max_reranks,
    max_steps: Annotated[Optional[int], typer.Option(min=1, hidden=True, help="Renamed --max-output-steps.")] = None,
    chunk_work: Annotated[
        int, typer.Option(min=1, help="A request of more work is decoded in chunks of this work, each queued on its own.")
    ] = LIMITS.chunk_work,
    request_timeout: Annotated[
        float, typer.Option(min=0, help="Seconds a request may take; later: 504 and its work stopped (0: no limit).")
    ] = LIMITS.request_timeout,
    api_key: Annotated[
        Optional[str], typer.Option(envvar="MTKIT_API_KEY", help="Require 'Authorization: Bearer KEY' (or set MTKIT_API_KEY).")
    ] = None,
    engine: Annotated[EngineName, typer.Option(help="auto: CTranslate2 for an `mtkit export` directory.")] = EngineName.AUTO,
    device: Device = "auto",
    comet_model: ServeCometModel = None,
    comet_encoder: RerankCometEncoder = None,
) -> None:
    """Serve translations over HTTP: POST /translate, GET /health, /info, /docs, and a page at /."""
    from mtkit.serving.app import run_server

    max_output_steps = _renamed_flag("--max-steps", max_steps, "--max-output-steps", max_output_steps, LIMITS.max_output_steps)
    limits = ServeLimits(
        max_lines=max_lines, max_chars=max_chars, max_queue=max_queue, max_work=max_work, max_output_steps=max_output_steps,
        chunk_work=chunk_work, request_timeout=request_timeout, max_wait_ms=max_wait_ms, batch_lines=batch_lines,
        workers=workers, api_key=api_key, max_reranks=max_reranks,
    )  # fmt: skip
    comet = CometOptions(model=comet_model, encoder=comet_encoder, device=device) if comet_model is not None else None
    run_server(model, engine=engine, device=device, host=host, port=port, limits=limits, comet=comet)


def _renamed_flag(old: str, old_value: int | None, new: str, new_value: int, default: int) -> int:
    """The value of a flag that was renamed: the old name still works, with a note on stderr."""
    if old_value is None:
        return new_value
    if new_value != default:
        raise MtkitError(f"{old} and {new} are the same limit ({old} is its old name): give only {new}")
    typer.echo(f"mtkit: {old} is deprecated; use {new} (the same limit)", err=True)
    return old_value


Hyps = Annotated[Optional[list[Path]], typer.Option("--hyp", help="Hypothesis file to score (repeat: compare systems).")]
EvalModels = Annotated[
    Optional[list[Path]],
    typer.Option("--model", "-m", help="Translate with this run or export, then score (repeat: an ensemble, or --compare)."),
]
FlagRule = Annotated[
    Optional[list[str]],
    typer.Option(help="A problem-flag threshold KEY=VALUE: loop_ngram, loop_count, copy_ratio, copy_min_words, length_band."),
]


PAIRED_TESTS = PairedTests()  # the paired significance tests' defaults, stated once
COMET = CometOptions(model="")  # the COMET scorer's defaults, stated once
EvalMetric = Annotated[
    Optional[QualityMetric],
    typer.Option(help="Also score with the COMET model --comet-model: comet (against the references) or qe (from the source)."),
]
CometModelOption = Annotated[
    Optional[str],
    typer.Option(
        help="With --metric: a COMET folder (hparams.yaml, checkpoints/model.ckpt) or hub id, e.g. Unbabel/wmt22-comet-da."
    ),
]
CometEncoderOption = Annotated[
    Optional[Path],
    typer.Option(
        help="Offline: a folder with the config.json and tokenizer of the encoder the COMET model's hparams.yaml names."
    ),
]


@app.command("evaluate")
def evaluate_command(
    hyp: Hyps = None,
    ref: Annotated[Optional[list[Path]], typer.Option(help="Reference file (repeat for several references).")] = None,
    model: EvalModels = None,
    split: Annotated[Optional[Split], typer.Option(help="With -m: score the recipe's valid or test split.")] = None,
    src: Annotated[Optional[Path], typer.Option(help="With -m: the source file to translate; with --hyp: its sources.")] = None,
    compare: Annotated[bool, typer.Option(help="With several -m: compare the models instead of ensembling them.")] = False,
    flags: Annotated[Optional[Path], typer.Option(help="Write the flagged sentences to this TSV, worst first.")] = None,
    flag_rule: FlagRule = None,
    seed: Annotated[int, typer.Option(help="Seed of the paired significance tests.")] = PAIRED_TESTS.seed,
    bootstrap_samples: Annotated[int, typer.Option(min=1, help="Paired bootstrap resamples.")] = PAIRED_TESTS.bootstrap_samples,
    randomisation_trials: Annotated[
        int, typer.Option(min=1, help="Paired approximate randomisation trials.")
    ] = PAIRED_TESTS.randomisation_trials,
    beam: Annotated[Optional[int], typer.Option(min=1, help="With -m: beam size (default: the recipe's).")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="With -m: also write the translations here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the scores as JSON.")] = False,
    record_scores: Annotated[bool, typer.Option("--save-scores/--no-save-scores",
        help="With one -m RUN_DIR and --split: record the scores in RUN_DIR/scores.json (for serve).")] = True,  # fmt: skip
    device: Device = "auto",
    tgt_lang: TgtLang = None,
    src_lang: SrcLang = None,
    off_target: Annotated[
        bool, typer.Option(help="Report the share of outputs not in the target language (pip install 'mtkit[langid]').")
    ] = False,
    metric: EvalMetric = None,
    comet_model: CometModelOption = None,
    comet_encoder: CometEncoderOption = None,
    comet_precision: Annotated[CometPrecision, typer.Option(help="The COMET model's weights.")] = CometPrecision(COMET.precision),
    shortlist: ShortlistOption = DECODING.shortlist,
    document_format: DocumentFormatOption = "text",
    split_by: SplitByOption = None,
) -> None:
    """Score with sacreBLEU (BLEU, chrF, TER, lowercased BLEU; with signatures) and COMET (--metric), flag problem sentences,
    compare systems with the first by paired significance tests; a multilingual split also direction by direction."""
    from mtkit.evaluation.report import EvaluateRequest, evaluate, save_scores, scores_directory

    request = EvaluateRequest(
        hyps=hyp or [], refs=ref or [], models=model or [], split=split.value if split else None, src=src, beam=beam,
        output=output, device=device, compare=compare, flags_file=flags, rules=parse_rules(flag_rule or []), shortlist=shortlist,
        tests=PairedTests(seed=seed, bootstrap_samples=bootstrap_samples, randomisation_trials=randomisation_trials),
        tgt_lang=tgt_lang, src_lang=src_lang, off_target=off_target, fast_paths=True, metric=metric.value if metric else None,
        comet=_comet_options(comet_model, encoder=comet_encoder, device=device, precision=comet_precision),
        document_format=document_format, split_by=split_by,
    )  # fmt: skip
    report = evaluate(request)
    typer.echo(json.dumps(report.to_dict(), indent=1) if as_json else report.format())
    directory = scores_directory(request)
    if record_scores and directory is not None and request.split is not None:
        save_scores(directory, request.split, result=report.systems[0].result)


def _comet_options(model: str | None, *, encoder: Path | None, device: str, precision: CometPrecision) -> CometOptions | None:
    """`--comet-model` and its options, or None without one."""
    return None if model is None else CometOptions(model=model, encoder=encoder, device=device, precision=precision.value)


@app.command("export")
def export_command(
    model: Annotated[
        list[Path], typer.Option("--model", "-m", help="Run directory (uses best.pt, else last.pt) or checkpoint file.")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory to write the exported model to.")],
    export_format: Annotated[
        ExportFormat, typer.Option("--format", help="The toolkit to export for.")
    ] = ExportFormat.CTRANSLATE2,
    quantization: Annotated[Optional[Quantization], typer.Option(help="Weight type (default: float32).")] = None,
    force: Annotated[bool, typer.Option(help="Replace an earlier export in --output.")] = False,
) -> None:
    """Export a trained Transformer for another toolkit: CTranslate2 (`mtkit translate -m DIR` then uses it) or
    Hugging Face transformers (a folder AutoModelForSeq2SeqLM loads, with a model card)."""
    from mtkit.exporters import export_model

    if len(model) > 1:
        raise MtkitError(
            f"-m given {len(model)} times: an export holds one model, and an ensemble cannot be one; export each model, "
            "or average checkpoints of one run into one (mtkit average)"
        )
    weights = quantization.value if quantization else None
    written = export_model(model[0], output, export_format=export_format, quantization=weights, force=force)
    typer.echo(f"exported {model[0]} ({weights or 'float32'}) to {written}; {_use_export(export_format, written)}")


def _use_export(export_format: ExportFormat, written: Path) -> str:
    if export_format is ExportFormat.TRANSFORMERS:
        return f"load it with transformers' AutoModelForSeq2SeqLM.from_pretrained({str(written)!r}) (see its README.md)"
    return f"translate with: mtkit translate -m {written}"


@app.command("plot")
def plot_command(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (their log.jsonl), drawn together.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The PNG to write.")] = Path("curves.png"),
) -> None:
    """Learning curves: training loss, validation loss and BLEU against updates and training time."""
    from mtkit.training.curves import plot_runs

    labels = plot_runs(runs, output)
    typer.echo(f"drew {', '.join(labels)} into {output}")


@app.command("average")
def average_command(
    model: Annotated[Path, typer.Option("--model", "-m", help="Run directory holding step_*.pt checkpoints (train.keep).")],
    last: Annotated[int, typer.Option(help="Average the weights of the N newest step_*.pt checkpoints.")] = 5,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Where to write (default: RUN/average.pt).")] = None,
) -> None:
    """Average the last N checkpoints of a run into one model for translate and evaluate."""
    from mtkit.models.checkpoint import average_checkpoints, save_checkpoint

    averaged, sources = average_checkpoints(model, last)
    target = output or RunFiles(model).average
    save_checkpoint(averaged, target)
    typer.echo(f"averaged {', '.join(p.name for p in sources)} into {target}")


@app.command("merge")
def merge_command(
    model: Annotated[Path, typer.Argument(help="A LoRA run (train.lora): its run directory or checkpoint file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The run directory to create.")],
) -> None:
    """Fold a LoRA run's adapters into its parent's weights: a plain run directory that needs no parent."""
    from mtkit.models.checkpoint import merge_run

    written = merge_run(model, output)
    typer.echo(f"merged the adapters of {model} into {written}; translate with: mtkit translate -m {output}")


ImportOutput = Annotated[Path, typer.Option("--output", "-o", help="The run directory to create.")]
ImportRevision = Annotated[
    Optional[str],
    typer.Option(help="For a hub id: the branch, tag or commit to download (default: the newest); best.pt records the commit."),
]


@import_app.command("marian")
def import_marian_command(
    source: Annotated[
        str, typer.Argument(help="A Hugging Face Marian folder (OPUS-MT), or a hub id such as Helsinki-NLP/opus-mt-de-en.")
    ],
    output: ImportOutput,
    revision: ImportRevision = None,
) -> None:
    """Import an OPUS-MT (Hugging Face Marian) model as a run directory that every command accepts."""
    _import(source, output, "marian", revision)


@import_app.command("auto")
def import_auto_command(
    source: Annotated[str, typer.Argument(help="A Hugging Face model folder, or a hub id; its config.json names the family.")],
    output: ImportOutput,
    revision: ImportRevision = None,
) -> None:
    """Import a model of any family mtkit reads, the one its config.json's model_type names, as a run directory."""
    _import(source, output, "auto", revision)


def _import(source: str, output: Path, family: str, revision: str | None) -> None:
    from mtkit.importers import import_model

    config, model = import_model(source, output, family=family, revision=revision)
    layers = f"{config.model.encoder_layers}+{config.model.decoder_layers}"
    parameters = sum(p.numel() for p in model.parameters()) / 1e6
    typer.echo(
        f"imported {source}: Transformer {layers} layers, d_model {config.model.d_model}, {config.model.activation}, "
        f"{parameters:.1f}M parameters, {config.src_lang}->{config.tgt_lang}; run directory {output}"
    )
    typer.echo(f"next: mtkit translate -m {output}, or fine-tune with `mtkit train RECIPE --init-from {output}`")


def main() -> None:
    """Console-script entry point. At exit, the objects still alive are left to the operating system instead of
    being walked by the interpreter's last garbage collections (`gc.freeze` as an exit handler, registered first so
    it runs after the others): with torch imported those were a large part of every command's exit
    (docs/development.md). The library (`import mtkit`) leaves the collector alone."""
    atexit.register(gc.freeze)
    app(prog_name="mtkit")


if __name__ == "__main__":
    main()
    sys.exit(0)
