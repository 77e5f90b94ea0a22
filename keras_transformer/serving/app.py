"""The HTTP application: ``POST /translate``, ``GET /health``, ``GET /metrics``.

A Starlette app served by uvicorn (``kt-serve``; ``docs/design.md`` says why
those). The translator is loaded and warmed up in the search thread after
the server starts, so ``/health`` can say "loading" (503) until it is ready.
Every answer, errors included, is JSON but for ``/metrics``.
"""

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import sys
import time
import traceback

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from keras_transformer.search.options import SearchOptions
from keras_transformer.serving.access import RateLimiter
from keras_transformer.serving.batcher import Aborted, Batcher, QueueFull, SearchFailed
from keras_transformer.serving.explain import explanation
from keras_transformer.serving.libretranslate import (
    is_libretranslate,
    languages_answer,
    parse_libretranslate,
)
from keras_transformer.serving.metrics import Metrics
from keras_transformer.serving.page import page_html
from keras_transformer.serving.requests import (
    KEY_FIELD,
    Limits,
    RequestError,
    parse_explain,
    parse_translate,
    read_fields,
)

# Seconds a client is asked to wait before it retries a 503.
RETRY_AFTER = 1
# HTTP has no code for "the client went away"; nginx's is the usual one.
CLIENT_CLOSED = 499
PATHS = ("/", "/translate", "/explain", "/languages", "/health", "/metrics")
# LibreTranslate's endpoints that a one-pair model server does not offer
# (docs/known-issues.md): answered 501 in its error shape, not 404.
NOT_OFFERED = ("/detect", "/translate_file", "/suggest")


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the server batches, what it accepts and from whom (``kt-serve``'s
    options).

    Attributes:
        max_batch_size: the most sentences per search call.
        search_batch_size: sentences searched together within a call, after
            sorting by length (8: the fastest on two CPU cores for random
            Multi30k sentences, with the Keras translator and CTranslate2;
            larger groups pad more short sentences to long ones).
        max_wait_ms: how long a request may wait for others to join its
            batch while the translator is idle.
        max_queue: the most sentences waiting; beyond, 503 with Retry-After.
        max_texts: texts per request.
        beam_sizes: the beam sizes a request may ask; each is compiled at
            warm-up (the translator's default beam size is always one).
        max_request_cost: the most source tokens × beam size per request.
        max_body_bytes: the largest request body.
        char_limit: the most characters of text per request, or None.
        req_limit: requests a minute per API key (per client address
            without keys), or None for no limit.
        api_keys: a ``KeyRing``, or None: anyone may translate.
        languages: ``(source, target)`` codes for a translator that records
            none, or None.
    """

    max_batch_size: int = 64
    search_batch_size: int = 8
    max_wait_ms: float = 5.0
    max_queue: int = 1024
    max_texts: int = 64
    beam_sizes: tuple = (1, 4)
    max_request_cost: int = 16384
    max_body_bytes: int = 1 << 20
    char_limit: int | None = None
    req_limit: int | None = None
    api_keys: object = None
    languages: tuple | None = None


def _error(status, message, retry_after=None):
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _disconnect(receive):
    """Returns when the client closes its connection (the ASGI server's
    ``http.disconnect``; the body must have been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _bearer(request):
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


class Service:
    """One translator behind the endpoints.

    Args:
        load: ``load()`` → an engine of the translator interface
            (``translate.base``); run in the search thread.
        name, version: what answers say they come from.
        settings: ``Settings``.
        on_ready: optional ``on_ready()``, once the translator is warm.
        on_failure: optional ``on_failure(error)``, if loading raised.
    """

    def __init__(
        self, load, name, version, settings=None, on_ready=None, on_failure=None
    ):
        self.settings = settings or Settings()
        self.name, self.version = name, version
        self.state, self.error = "loading", None
        self.translator = None
        self.languages = None
        self._load = load
        self.on_ready, self.on_failure = on_ready, on_failure
        self.limits = None
        self.limiter = (
            RateLimiter(self.settings.req_limit) if self.settings.req_limit else None
        )
        self.executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="kt-serve-search"
        )
        self.batcher = None
        self.metrics = Metrics(lambda: self.batcher.queued if self.batcher else 0)

    def app(self):
        """The Starlette application."""
        routes = [
            Route("/", self._counted(self.page), methods=["GET"]),
            Route("/translate", self._counted(self.translate), methods=["POST"]),
            Route("/explain", self._counted(self.explain), methods=["POST"]),
            Route("/languages", self._counted(self.languages_list), methods=["GET"]),
            Route("/health", self._counted(self.health), methods=["GET"]),
            Route("/metrics", self._counted(self.scrape), methods=["GET"]),
        ]
        routes += [
            Route(path, self._counted(self.not_offered), methods=["GET", "POST"])
            for path in NOT_OFFERED
        ]
        app = Starlette(
            routes=routes,
            lifespan=self._lifespan,
            exception_handlers={
                HTTPException: self._http_error,
                Exception: self._server_error,
            },
        )
        # A redirect to "/translate" from "/translate/" would build its
        # Location from the client's Host header.
        app.router.redirect_slashes = False
        return app

    # -- life -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        settings = self.settings
        self.batcher = Batcher(
            self._translate,
            self.executor,
            max_batch_size=settings.max_batch_size,
            max_wait=settings.max_wait_ms / 1000,
            max_queue=settings.max_queue,
            on_batch=self.metrics.batch,
        )
        self.batcher.start()
        loading = asyncio.ensure_future(self._start())
        try:
            yield
        finally:
            # The ASGI server has finished the requests it held; the queue is
            # empty, but a batch may still run.
            await self.batcher.stop()
            loading.cancel()
            self.executor.shutdown(wait=False, cancel_futures=True)

    async def _start(self):
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, self._load_and_warm_up)
        except Exception as error:
            self.state, self.error = "failed", f"{type(error).__name__}: {error}"
            if self.on_failure is not None:
                self.on_failure(error)
            return
        self.state = "ready"
        if self.on_ready is not None:
            self.on_ready()

    def _load_and_warm_up(self):
        # Any engine of the translator interface (translate.base): the
        # calls below are the interface's.
        translator = self._load()
        self.languages = _languages(translator, self.settings.languages)
        # A call's sentences are sorted by length and searched in groups of
        # search_batch_size, each padded to that many rows: a Keras
        # translator then compiles one search per width and beam size, all
        # of them now, not one of several seconds on the search thread
        # whenever a group of a new size arrives.
        search = translator.search_options(
            batch_size=min(
                self.settings.search_batch_size, self.settings.max_batch_size
            ),
            fixed_batch=True,
        )
        beam_sizes = tuple(sorted({*self.settings.beam_sizes, search.beam_size}))
        self.limits = Limits(
            max_texts=self.settings.max_texts,
            max_tokens=translator.source_max_length or sys.maxsize,
            beam_sizes=beam_sizes,
            max_cost=self.settings.max_request_cost,
            max_chars=self.settings.char_limit,
            search=search,
        )
        for beam_size in beam_sizes:
            translator.warm_up(SearchOptions.of(search, beam_size=beam_size))
        self.translator = translator

    def _encode(self, texts, target_language=None):
        """Each text's ids, as they are admitted and then searched: a request
        is encoded here, on the event loop, once (the tokenizer runs in
        Python, with no framework op), and only these ids reach the search
        thread. Not cut: a text over the model's length is refused."""
        translator = self.translator
        try:
            texts = translator.with_target_language(texts, target_language)
        except ValueError as error:
            # A model into several languages, asked for none.
            raise RequestError(400, str(error)[:300]) from None
        return translator.tokenizer.encode(texts)

    def _translate(self, sources, options, wanted):
        """The batcher's search call: the sources sorted by length (the one
        sort they get) and searched a group at a time, as the translator
        would, so that the groups of a client that has gone meanwhile are
        skipped, not searched."""
        search, n = options
        translator = self.translator
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        results = [None] * len(sources)
        for start in range(0, len(order), search.batch_size):
            chunk, still = order[start : start + search.batch_size], wanted()
            group = [i for i in chunk if still[i]]
            self.metrics.dropped.inc(len(chunk) - len(group))
            if not group:
                continue
            found = translator.search_ids_sorted(
                [sources[i] for i in group], search, top_n=1 if n is None else n
            )
            if n is None:
                answers = translator.detokenize([row[0][0] for row in found])
            else:
                answers = translator.n_best_texts(found, n)
            for i, answer in zip(group, answers, strict=True):
                results[i] = answer
        return results

    # -- endpoints --------------------------------------------------------------

    def _counted(self, endpoint):
        async def counted(request):
            response = await endpoint(request)
            self.metrics.requests.labels(request.url.path, response.status_code).inc()
            return response

        return counted

    def _path(self, request):
        # Any path may be asked for; one series per path would grow without
        # bound.
        return request.url.path if request.url.path in PATHS else "other"

    async def _http_error(self, request, error):
        response = _error(error.status_code, error.detail)
        self.metrics.requests.labels(self._path(request), error.status_code).inc()
        return response

    async def _server_error(self, request, error):
        # Starlette logs the traceback (on stderr) after this answer.
        self.metrics.requests.labels(self._path(request), 500).inc()
        self.metrics.errors.labels("internal").inc()
        return _error(500, f"internal error ({type(error).__name__})")

    async def page(self, request):
        return HTMLResponse(page_html())

    async def not_offered(self, request):
        return _error(
            501,
            f"{request.url.path} (LibreTranslate's) is not offered by kt-serve: "
            "it translates one language pair, with no language detection, file "
            "translation or suggestions",
        )

    async def health(self, request):
        if self.state != "ready":
            body = {"status": self.state}
            if self.error:
                body["error"] = self.error
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse(
            {
                "status": "ready",
                "model": self.name,
                "version": self.version,
                "engine": self.translator.engine,
                "languages": list(self.languages) if self.languages else None,
                "beam_sizes": list(self.limits.beam_sizes),
                "beam_size": self.limits.search.beam_size,
                "attention": self.translator.gives_attention,
                "api_key_required": self.settings.api_keys is not None,
            }
        )

    async def languages_list(self, request):
        if self.state != "ready":
            return _error(503, f"the model is {self.state}", retry_after=RETRY_AFTER)
        return JSONResponse(
            languages_answer(self.languages, self.translator.target_languages)
        )

    async def scrape(self, request):
        if self.settings.api_keys is not None:
            key = _bearer(request) or request.query_params.get(KEY_FIELD)
            if self.settings.api_keys.name_of(key) is None:
                return _error(403, "the metrics need an API key (Bearer or api_key)")
        body, content_type = self.metrics.text()
        return Response(body, media_type=content_type)

    async def translate(self, request):
        start = time.monotonic()
        response = await self._answer(request, self._parse_translate)
        self.metrics.latency.observe(time.monotonic() - start)
        return response

    async def explain(self, request):
        return await self._answer(request, self._parse_explain, self._explanation)

    def _parse_translate(self, fields):
        if is_libretranslate(fields):
            return parse_libretranslate(
                fields,
                self.limits,
                self._encode,
                self.languages,
                self.translator.target_languages,
            )
        return parse_translate(fields, self.limits, self._encode)

    def _parse_explain(self, fields):
        return parse_explain(fields, self.limits, self._encode)

    async def _explanation(self, parsed, results):
        loop = asyncio.get_running_loop()
        # The attention runs the model: on the search thread, in turn.
        return await loop.run_in_executor(
            self.executor, explanation, self.translator, parsed.texts[0], results[0]
        )

    async def _answer(self, request, parse, finish=None):
        """Checks the caller and the request, queues its search, answers."""
        if self.state != "ready":
            self.metrics.errors.labels("not_ready").inc()
            return _error(503, f"the model is {self.state}", retry_after=RETRY_AFTER)
        caller = "anonymous"
        try:
            fields = read_fields(
                await self._body(request),
                request.headers.get("content-type", ""),
                request.url.query,
            )
            caller, bucket = self._identify(request, fields)
            self._limit(bucket)
            parsed = parse(fields)
        except RequestError as error:
            self.metrics.errors.labels(error.kind).inc()
            self.metrics.callers.labels(caller, error.status).inc()
            return _error(error.status, error.message, error.retry_after)
        except ClientDisconnect:
            # The client went away before its body's end, or the server gave
            # up waiting for it (the body timeout: answered 408 and closed).
            self.metrics.errors.labels("disconnected").inc()
            return Response(status_code=CLIENT_CLOSED)
        response = await self._search(request, parsed, finish)
        self.metrics.callers.labels(caller, response.status_code).inc()
        return response

    def _identify(self, request, fields):
        """``(name, bucket)``: the caller's name in the metrics (a key's
        line, or anonymous) and whose rate it counts against (its key, or
        its address without keys); 403 for a missing or wrong key."""
        keys = self.settings.api_keys
        key = fields.pop(KEY_FIELD, None) or _bearer(request)
        if keys is None:
            # LibreTranslate without keys accepts and ignores an api_key.
            return "anonymous", f"address {request.client.host}"
        name = keys.name_of(key)
        if name is None:
            raise RequestError(
                403,
                "Invalid API key" if key else "Missing API key: give api_key",
                kind="forbidden",
            )
        return name, name

    def _limit(self, bucket):
        if self.limiter is None:
            return
        wait = self.limiter.take(bucket)
        if wait:
            raise RequestError(
                429,
                f"Too many requests: at most {self.limiter.per_minute} a minute; "
                f"retry in {wait} s",
                kind="rate_limited",
                retry_after=wait,
            )

    async def _search(self, request, parsed, finish):
        if not parsed.texts:
            return JSONResponse(parsed.answer([]))  # markup without text
        # The target language is in the sources' ids: requests into any of a
        # model's languages share a batch.
        options = (parsed.search, parsed.n)
        job = asyncio.ensure_future(self.batcher.submit(parsed.sources, options))
        gone = asyncio.ensure_future(_disconnect(request.receive))
        await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not job.done():
            # Its job stays queued, cancelled: the batcher skips it.
            job.cancel()
            self.metrics.errors.labels("disconnected").inc()
            return Response(status_code=CLIENT_CLOSED)
        try:
            results = job.result()
        except Aborted as error:
            self.metrics.errors.labels("aborted").inc()
            return _error(503, str(error), retry_after=RETRY_AFTER)
        except QueueFull as error:
            self.metrics.errors.labels("queue_full").inc()
            return _error(503, f"the server is busy: {error}", retry_after=RETRY_AFTER)
        except SearchFailed as error:
            self.metrics.errors.labels("search_failed").inc()
            traceback.print_exception(error.cause, file=sys.stderr)
            return _error(500, f"the search of this request's batch failed: {error}")
        self.metrics.sentences.inc(len(results))
        if finish is not None:
            return JSONResponse(await finish(parsed, results))
        body = parsed.answer(results)
        if "translations" in body:  # this package's shape, not LibreTranslate's
            body.update(model=self.name, version=self.version)
        return JSONResponse(body)

    async def _body(self, request):
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise RequestError(
                413, f"the body is {declared[:20]} bytes; at most {limit}"
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"the body is over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)


def _languages(translator, asked):
    """The pair the server offers: the translator's, or the one kt-serve
    was given for a translator that records none; a disagreement is an
    error rather than a guess."""
    if asked is None or translator.languages is None:
        return translator.languages or asked
    if tuple(asked) != tuple(translator.languages):
        raise ValueError(
            f"the model translates {' → '.join(translator.languages)}, but "
            f"--source-lang/--target-lang say {' → '.join(asked)}"
        )
    return tuple(asked)
