"""`mtkit serve`: a translation HTTP server (FastAPI + uvicorn) over any engine, with dynamic batching.

    POST /translate  {"text": ["...", ...], "beam": 5, "nbest": 1, ...}  ->  {"translations": [...]}
    GET  /health     ready or not;   GET /info  the model;   GET /  a page to try it;   /docs  OpenAPI

Requests from many clients are merged into batches by one worker (`mtkit.serving.batcher`). Limits and
failures are answered with a status and a one-line reason, and the server keeps serving: a full
queue is 503 with Retry-After, too many lines, characters or decoding work 413, a malformed body or
an unknown field 422, a bad option or text the model cannot read 400, a wrong or missing API key
401, a request past its deadline 504. A request whose client has gone or whose deadline has passed
stops between two decoding steps, so its worker is free for the next. SIGTERM stops accepting, answers
what is in flight, and exits 0 (uvicorn's graceful shutdown; the worker stops last).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import hmac
import sys
from collections.abc import AsyncIterator, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from mtkit.config import TEMPERATURE
from mtkit.decoding.options import SEED_LIMIT, Decoding, Sampling
from mtkit.decoding.terminology.terms import Term, as_terms
from mtkit.decoding.translator import Translation, Translator
from mtkit.documents.aligner import aligner_of
from mtkit.documents.formats import FORMATS, DocumentLimits, DocumentTooLarge
from mtkit.documents.pipeline import DocumentBatch
from mtkit.documents.sentences import SentenceSplitter, sentence_splitter
from mtkit.errors import MtkitError, OptionError, cli_flag, one_line
from mtkit.evaluation.comet.options import CometOptions
from mtkit.evaluation.comet.scorer import CometScorer
from mtkit.evaluation.rerank import Reranker, RerankOptions
from mtkit.options import ConstraintOrder, SplitBy
from mtkit.run_files import RunFiles
from mtkit.runtime import cpu_cores, resolve_device, set_threads_per_worker, stop_signals_call
from mtkit.serving.batcher import Batcher, QueueFull
from mtkit.serving.body import BodyLimit
from mtkit.serving.hosts import HostCheck
from mtkit.serving.limits import CPU_BATCH_LINES, CPU_WORKERS, HOST, MOST_BEAM, OTHER_BATCH_LINES, ServeLimits, body_limit
from mtkit.serving.rerank_jobs import RerankBusy, RerankJobs

API_KEY_VARIABLE = "MTKIT_API_KEY"
MOST_NGRAM = 64  # the largest no_repeat_ngram a request may ask for
MOST_PHRASES = 16  # constraint phrases (alternatives counted) per sentence
DECODING, SAMPLING = Decoding(), Sampling()  # the defaults of a request's options, stated there once
FormatName = Literal[tuple(FORMATS)]  # type: ignore[valid-type]  a request's format: a name of documents.formats.FORMATS


class TranslateRequest(BaseModel):
    """The body of POST /translate; options left out take the model's decoding defaults."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    text: list[str] = Field(description="Sentences to translate, one translation each, in order.")
    beam: int | None = Field(DECODING.beam, ge=1, le=MOST_BEAM)
    nbest: int = Field(DECODING.nbest, ge=1, le=MOST_BEAM)
    length_penalty: float | None = Field(DECODING.length_penalty, ge=0.0, le=10.0)
    prefix: list[str] | None = Field(None, description="One target prefix per sentence (empty: none).")
    sampling: str | None = Field(None, description="topk:K, topp:P or full.")
    temperature: float = Field(
        SAMPLING.temperature, ge=TEMPERATURE.low, le=TEMPERATURE.high, description="With sampling: divide the logits by it."
    )
    seed: int = Field(SAMPLING.seed, ge=0, le=SEED_LIMIT)
    no_repeat_ngram: int = Field(DECODING.no_repeat_ngram, ge=0, le=MOST_NGRAM)
    alignments: bool = DECODING.alignments
    constraints: list[list[str | list[str]]] | None = Field(
        None,
        description="Per sentence, the terms its translation must contain (a phrase or a list of alternatives); [] for none.",
    )
    constraints_order: Literal["any", "given"] = ConstraintOrder.of(in_order=DECODING.constraints_in_order).value
    tgt_lang: str | None = Field(
        None, max_length=32, description="The language to translate into, for a model of several (see /info target_languages)."
    )
    rerank: Literal["qe", "mbr"] | None = Field(
        None, description="Choose each translation among `candidates`: qe (the server's COMET-QE model) or mbr (the consensus)."
    )
    candidates: int | None = Field(
        None, ge=1, le=MOST_BEAM, description="With rerank: the beam's n-best (up to beam) or samples."
    )
    mbr_utility: Literal["chrf", "comet"] | None = Field(None, description="With rerank mbr: chrf (default) or comet.")
    src_lang: str | None = Field(
        None, max_length=32, description="The source's language code, for an imported NLLB-200, M2M-100 or mBART-50 model."
    )
    shortlist: bool | None = Field(
        DECODING.shortlist, description="Search over the model's vocabulary shortlist (default: when it has one)."
    )
    format: FormatName = Field(
        "text", description="Each text is a document in this format (html, xml...): its markup kept, its words translated."
    )
    split_by: SplitBy | None = Field(
        None,
        description="sentences: each text cut into sentences, translated, rebuilt with its spacing; lines: each text "
        "whole (default: the model's decode.split_by).",
    )


def create_app(
    translator: Translator,
    limits: ServeLimits,
    *,
    info: dict[str, Any],
    comet: CometScorer | None = None,
    host: str = HOST,
) -> FastAPI:
    """The application: the routes over one translator and its batcher (and the COMET model that reranks, if any);
    without an API key, only requests to the names of `host` (the address it is bound to) or loopback."""
    service = TranslationService(translator, batching_for(translator, limits), comet=comet)
    app = FastAPI(title="mtkit", summary="Neural machine translation", lifespan=service.running)
    app.state.ready, app.state.batcher, app.state.reranks = False, service.batcher, service.reranks
    authorised = _key_check(limits.api_key)
    app.add_exception_handler(RequestValidationError, _invalid_body)
    app.add_middleware(BodyLimit, limit=body_limit(limits.max_chars))
    if limits.api_key is None:  # added last, so it is the outermost layer: a wrong Host is refused first
        app.add_middleware(HostCheck, bound=host)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> str:
        return resources.files("mtkit.serving").joinpath("static/index.html").read_text(encoding="utf-8")

    @app.get("/health")
    def health() -> JSONResponse:
        ready = bool(app.state.ready)
        return JSONResponse({"status": "ready" if ready else "starting"}, status_code=200 if ready else 503)

    @app.get("/info", dependencies=[Depends(authorised)])
    def describe() -> dict[str, Any]:
        return info

    @app.post("/translate", dependencies=[Depends(authorised)])
    async def translate(body: TranslateRequest, request: Request) -> dict[str, Any]:
        return await service.translate(body, request)

    return app


class TranslationService:
    """What POST /translate runs on: one translator, its batcher and the rerankings, within one server's limits."""

    def __init__(self, translator: Translator, limits: ServeLimits, *, comet: CometScorer | None = None) -> None:
        self.translator, self.limits, self.comet = translator, limits, comet
        self.aligner = aligner_of(translator.directory)  # what places a document's tags, else the model's attention
        self.batcher = Batcher(translator, max_wait=limits.max_wait_ms / 1000, max_queue=limits.max_queue,
                               workers=limits.workers, batch_lines=limits.batch_lines, chunk_work=limits.chunk_work)  # fmt: skip
        self.reranks = RerankJobs(limits.max_reranks)

    @contextlib.asynccontextmanager
    async def running(self, app: FastAPI) -> AsyncIterator[None]:
        """The server's lifespan: the batcher's workers run, and `app` says it is ready, until the server stops."""
        worker = asyncio.create_task(self.batcher.run())
        app.state.ready = True
        yield
        app.state.ready = False
        worker.cancel()
        self.batcher.close()
        self.reranks.close()

    async def translate(self, body: TranslateRequest, request: Request) -> dict[str, Any]:
        """The answer to one request: checked, queued, decoded and reranked within its deadline while its client waits."""
        limits = self.limits
        body, documents = _documents(body, limits, placed_by_model=self.aligner is None)
        reranker = _reranker(body, self.comet)
        decoding, splitter, line_work = _decoding(self.translator, body, limits, reranker)
        deadline = Deadline.after(limits.request_timeout)
        try:
            with self.reranks.slot() if reranker is not None else contextlib.nullcontext():
                pending = self.batcher.translate(
                    body.text, decoding, prefixes=body.prefix, constraints=_terms(body), line_work=line_work, splitter=splitter
                )
                found = await _unless_gone(request, pending, deadline)
                if reranker is not None:  # under the same deadline and disconnect watch
                    found = await _unless_gone(request, self.reranks.choose(reranker, body.text, found=found), deadline)
        except QueueFull:
            raise HTTPException(503, "the queue is full; retry shortly", headers={"Retry-After": "1"}) from None
        except RerankBusy:
            busy = f"the server reranks for {limits.max_reranks} requests at once (--max-reranks), all taken; retry shortly"
            raise HTTPException(503, busy, headers={"Retry-After": "1"}) from None
        except MtkitError as err:
            raise HTTPException(400, worded(err)) from None
        if documents is None:
            return _answer(body, found)
        written = await asyncio.to_thread(documents.written, found, aligner=self.aligner)  # eflomal runs off the loop
        return {"translations": [document.markup for document in written]}


def _answer(body: TranslateRequest, found: list[list[Translation]]) -> dict[str, Any]:
    """The response: each sentence's translation (or n-best; a reranking's choice first), and the terms each lacks
    when the request gave constraints."""
    answer: dict[str, Any] = {"translations": [_render(translations, body) for translations in found]}
    if body.constraints is not None:  # the terms each best translation lacks (its output cap came first)
        answer["unmet"] = [translations[0].unmet if translations else [] for translations in found]
    return answer


def _reranker(body: TranslateRequest, comet: CometScorer | None) -> Reranker | None:
    """The request's reranking, checked (400 in one line); the server's COMET model where the method reads one."""
    reads_comet = body.rerank == "qe" or (body.rerank == "mbr" and body.mbr_utility == "comet")
    options = RerankOptions(method=body.rerank, candidates=body.candidates, utility=body.mbr_utility,
                            comet=comet.options if comet is not None and reads_comet else None)  # fmt: skip
    try:
        return Reranker.load(options, nbest=body.nbest, scorer=comet)
    except MtkitError as err:
        raise HTTPException(400, worded(err)) from None


def batching_for(translator: Translator, limits: ServeLimits) -> ServeLimits:
    """Limits with `workers` and `batch_lines` chosen where left at 0.

    On CPU, small matrix products use two cores poorly: two workers of one thread each, each
    decoding batches of up to 16 sentences, came closer to offline throughput under many
    one-sentence clients than one two-thread worker with batches of 32 (benchmarks/serve.py; the
    figures are in docs/performance.md).
    A GPU (or CTranslate2, which threads itself) wants one worker and large batches.
    """

    device = getattr(translator.engine, "device", None)
    on_cpu = translator.engine.name == "pytorch" and device is not None and device.type == "cpu" and cpu_cores() >= 2
    workers = limits.workers or (CPU_WORKERS if on_cpu else 1)
    batch_lines = limits.batch_lines or (CPU_BATCH_LINES if on_cpu else OTHER_BATCH_LINES)
    return dataclasses.replace(limits, workers=workers, batch_lines=batch_lines)


def _decoding(
    translator: Translator, body: TranslateRequest, limits: ServeLimits, reranker: Reranker | None
) -> tuple[Decoding, SentenceSplitter | None, list[int]]:
    """The request's decoding (its candidates with a `reranker`), its sentence splitter (`split_by`) and each line's
    work (`Plan.line_work`: its sentences' output caps x beam), checked against the limits and the engine before
    queueing."""
    _check_size(body, limits)
    if body.prefix is not None and len(body.prefix) != len(body.text):
        raise HTTPException(400, f"{len(body.prefix)} prefixes for {len(body.text)} sentences; give one per sentence")
    _check_constraints(body)
    for line in [*body.text, *(body.prefix or []), *_phrases(body)]:
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            raise HTTPException(400, f"text {line[:30]!r} is not valid Unicode (a lone surrogate); send UTF-8 text") from None
    try:
        sampling = Sampling.parse(body.sampling, body.temperature, seed=body.seed) if body.sampling is not None else None
        in_order, ngram = body.constraints_order == "given", body.no_repeat_ngram
        nbest = reranker.candidates if reranker is not None else body.nbest
        decoding = Decoding(
            beam=body.beam, nbest=nbest, length_penalty=body.length_penalty, sampling=sampling, no_repeat_ngram=ngram,
            alignments=body.alignments, constraints_in_order=in_order, tgt_lang=body.tgt_lang, src_lang=body.src_lang,
            shortlist=body.shortlist,
        )  # fmt: skip
        if reranker is not None:
            reranker.check(translator, decoding)
        splitter = sentence_splitter(translator, split_by=body.split_by, language=body.src_lang)
        # the plan refuses what the engine cannot do
        plan = translator.plan(body.text, decoding, prefixes=body.prefix, constraints=_terms(body), splitter=splitter)
    except MtkitError as err:
        raise HTTPException(400, worded(err)) from None
    work, steps = plan.work, plan.most_steps
    if steps > limits.max_output_steps:
        raise HTTPException(
            413,
            f"a sentence of this request may take {steps} decoding steps (its output cap, or its prefix); the limit is "
            f"{limits.max_output_steps}: send shorter sentences or prefixes",
        )
    reranking = reranker.work(len(body.text)) if reranker is not None else 0
    if work + reranking > limits.max_work:
        also = f" and {reranker.describe_work(len(body.text))}" if reranker is not None else ""
        raise HTTPException(
            413,
            f"this request may take {work} decoding steps (each sentence's output cap x beam){also}; the limit is "
            f"{limits.max_work}: send fewer or shorter sentences, or a smaller beam, nbest or candidates",
        )
    return decoding, splitter, plan.line_work


def _check_size(body: TranslateRequest, limits: ServeLimits) -> None:
    """The request's lines and characters within the server's limits (413)."""
    if len(body.text) > limits.max_lines:
        raise HTTPException(413, f"{len(body.text)} sentences in one request; the limit is {limits.max_lines}")
    characters = sum(len(line) for line in body.text) + sum(len(p) for p in body.prefix or [])
    characters += sum(len(term) for term in _phrases(body))
    if characters > limits.max_chars:
        raise HTTPException(413, f"{characters} characters in one request; the limit is {limits.max_chars}")


def _documents(
    body: TranslateRequest, limits: ServeLimits, *, placed_by_model: bool
) -> tuple[TranslateRequest, DocumentBatch | None]:
    """A request of documents as a request of their blocks' texts (with alignments where the model's place their
    markup), and the documents to write the translations back into; a request of text as it is."""
    if body.format == "text":
        return body, None
    for name, given in (("prefix", body.prefix), ("constraints", body.constraints), ("rerank", body.rerank)):
        if given is not None:
            raise HTTPException(400, f"{name}: one per sentence, which format {body.format} has not; leave it out")
    if body.nbest != 1:
        raise HTTPException(400, f"nbest {body.nbest}: a document is written back with its best translation; leave nbest at 1")
    _check_size(body, limits)  # the documents themselves, before they are read
    names = [f"text[{index}]" for index in range(len(body.text))]
    try:  # bounded by the characters already: depth and tags are the documents' own bounds
        documents = DocumentBatch.read(body.text, document_format=body.format, names=names, limits=DocumentLimits())
    except DocumentTooLarge as err:
        raise HTTPException(413, one_line(err)) from None
    except MtkitError as err:
        raise HTTPException(400, one_line(err)) from None
    if len(documents.texts) > limits.max_lines:
        blocks = f"{len(documents.texts)} blocks of text"
        raise HTTPException(413, f"the documents of this request hold {blocks}; the limit is {limits.max_lines} (--max-lines)")
    alignments = body.alignments or (placed_by_model and any(block.spans for block in documents.masked))
    return body.model_copy(update={"text": documents.texts, "alignments": alignments}), documents


def worded(err: MtkitError) -> str:
    """An error as the server says it: an option that is a request field by its JSON name (`tgt_lang`),
    any other (a setting of `mtkit serve` itself) as the command line spells it."""
    return one_line(err.worded(_field) if isinstance(err, OptionError) else err)


def _field(option: str) -> str:
    return option if option in TranslateRequest.model_fields else cli_flag(option)


def _check_constraints(body: TranslateRequest) -> None:
    """One list of constraints per sentence, each within MOST_PHRASES phrases."""
    if body.constraints is None:
        return
    if len(body.constraints) != len(body.text):
        counts = f"{len(body.constraints)} lists for {len(body.text)} sentences"
        raise HTTPException(400, f"constraints: {counts}; give one per sentence ([] for none)")
    for n, terms in enumerate(body.constraints):
        phrases = sum(1 if isinstance(term, str) else len(term) for term in terms)
        if phrases > MOST_PHRASES:
            raise HTTPException(413, f"constraints[{n}]: {phrases} phrases for one sentence; the limit is {MOST_PHRASES}")


def _phrases(body: TranslateRequest) -> list[str]:
    return [p for terms in body.constraints or [] for term in terms for p in ([term] if isinstance(term, str) else term)]


def _terms(body: TranslateRequest) -> list[list[Term]] | None:
    """The request's constraints as terms whose errors name the field (constraints[N])."""
    if body.constraints is None:
        return None
    try:
        return [as_terms(terms, f"constraints[{n}]") for n, terms in enumerate(body.constraints)]
    except MtkitError as err:
        raise HTTPException(400, one_line(err)) from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Deadline:
    """When a request's time is up (`--request-timeout` from its arrival; `at` None: never), on the event loop's clock."""

    limit: float
    at: float | None

    @classmethod
    def after(cls, limit: float) -> Deadline:
        return cls(limit=limit, at=asyncio.get_running_loop().time() + limit if limit else None)

    def remaining(self) -> float | None:
        return None if self.at is None else max(0.0, self.at - asyncio.get_running_loop().time())


async def _unless_gone(request: Request, pending: Any, deadline: Deadline) -> list[list[Translation]]:
    """Await the translations (or their reranking), cancelling `pending` if the client disconnects or the deadline
    passes meanwhile: its queued requests are dropped, its search or reranking stops at its next step or chunk.

    The disconnect is awaited, not polled: polling every pending request wakes the event loop
    hundreds of times a second, which takes the interpreter lock from the decoding thread.
    """
    task, gone = asyncio.ensure_future(pending), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, timeout=deadline.remaining(), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task})  # its cancellation handled (queued chunks dropped, a reranking told to stop) first
    if gone.done() and not gone.cancelled():
        raise HTTPException(499, "the client closed the connection")
    limit = deadline.limit
    raise HTTPException(504, f"the translation took longer than the server's limit of {limit:g} s; send less at once")


async def _disconnected(request: Request) -> None:
    """Return once the client has closed the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _render(translations: list[Translation], body: TranslateRequest) -> Any:
    """A string, or with nbest > 1 or alignments, objects with text, score and alignment."""
    if body.nbest == 1 and not body.alignments:
        return translations[0].text
    found = [
        {"text": t.text, "score": t.score, "alignment": t.alignment} if body.alignments else {"text": t.text, "score": t.score}
        for t in translations
    ]
    return found if body.nbest > 1 else found[0]


def _key_check(api_key: str | None):  # noqa: ANN202 - a FastAPI dependency
    """A dependency that requires `Authorization: Bearer KEY` when a key is set (constant-time compare)."""

    def check(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), api_key.encode()):
            raise HTTPException(
                401,
                "a valid API key is needed: send the header 'Authorization: Bearer KEY'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check


async def _invalid_body(request: Request, error: Exception) -> JSONResponse:
    """422 with one line naming the first bad field, instead of FastAPI's list of errors."""
    assert isinstance(error, RequestValidationError)
    first = error.errors()[0] if error.errors() else {"loc": ["body"], "msg": "invalid body"}
    where = ".".join(str(part) for part in first.get("loc", []) if part != "body" and not isinstance(part, int)) or "body"
    if first.get("type") == "extra_forbidden":
        return JSONResponse({"detail": _unknown_field(where)}, status_code=422)
    return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid')}"}, status_code=422)


def _unknown_field(name: str) -> str:
    """One line for a field the request does not have, with the closest one it does."""
    fields = list(TranslateRequest.model_fields)
    closest = difflib.get_close_matches(name, fields, n=1)
    hint = f"did you mean {closest[0]!r}? " if closest else ""
    return f"{name[:40]!r} is not a field of the request; {hint}the fields are {', '.join(fields)}"


def model_info(translator: Translator, path: str) -> dict[str, Any]:
    """What GET /info says: languages, architecture, parameters, engine, known test scores."""

    config = translator.config
    engine = translator.engine
    model = getattr(engine, "model", None)
    parameters = model.num_parameters() if hasattr(model, "num_parameters") else None
    return {
        "model": path,
        "engine": engine.name,
        "source_language": config.src_lang if config else None,
        "target_language": config.tgt_lang if config else None,
        # a model of several (data.lang_tag: target) needs one of them as each request's tgt_lang
        "target_languages": translator.target_languages,
        "needs_tgt_lang": translator.tagged and len(translator.target_languages) > 1,
        "architecture": config.model.arch if config else None,
        "parameters": parameters,
        "capabilities": sorted(capability.value for capability in engine.capabilities),
        "decoding": {"beam": translator.decode.beam, "length_penalty": translator.decode.length_penalty},
        "test_scores": RunFiles(Path(path)).read_scores(),
    }


def run_server(
    models: list[Path], *, engine: str, device: str, host: str, port: int, limits: ServeLimits, comet: CometOptions | None = None
) -> None:
    """Load the model(s) (and the COMET model that `rerank` requests read, if any), then serve until SIGINT or
    SIGTERM (graceful: in-flight requests are answered).

    The server's front end: it owns the process, so it asks for the fast paths and sets torch's threads.
    """
    scorer = CometScorer.load(comet) if comet is not None else None
    resolved = resolve_device(device)
    # Each worker decodes on its share of the cores: set before loading, so that the fast paths are measured at
    # the threads they will run with; set again once the engine is known (CTranslate2 has one worker)
    set_threads_per_worker(limits.workers or (CPU_WORKERS if resolved.type == "cpu" and cpu_cores() >= 2 else 1))
    translator = Translator.load(models, engine, device=str(resolved), fast_paths=True)
    limits = batching_for(translator, limits)
    set_threads_per_worker(limits.workers)
    info = model_info(translator, " + ".join(str(m) for m in models))
    app = create_app(translator, limits, info=info, comet=scorer, host=host)
    print(f"mtkit: serving {', '.join(map(str, models))} on http://{host}:{port} (docs: /docs)", file=sys.stderr)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=60)
    _GracefulServer(config).run()
    print("mtkit: stopped; every request in flight was answered", file=sys.stderr)


class _GracefulServer(uvicorn.Server):
    """uvicorn's server, except that SIGINT/SIGTERM end it with status 0 (uvicorn raises the signal
    again once it has shut down, which would end the process as killed by it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with stop_signals_call(self.handle_exit):
            yield
