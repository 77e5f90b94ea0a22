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
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from keras_transformer.serving.batcher import Batcher, QueueFull, SearchFailed
from keras_transformer.serving.metrics import Metrics
from keras_transformer.serving.requests import Limits, RequestError, parse_translate

# Seconds a client is asked to wait before it retries a 503.
RETRY_AFTER = 1
# HTTP has no code for "the client went away"; nginx's is the usual one.
CLIENT_CLOSED = 499
PATHS = ("/translate", "/health", "/metrics")


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the server batches and what it accepts (``kt-serve``'s options).

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
        max_beam_size: the largest ``beam_size`` a request may ask.
        max_body_bytes: the largest request body.
    """

    max_batch_size: int = 64
    search_batch_size: int = 8
    max_wait_ms: float = 5.0
    max_queue: int = 1024
    max_texts: int = 64
    max_beam_size: int = 16
    max_body_bytes: int = 1 << 20


def _error(status, message, retry=False):
    headers = {"Retry-After": str(RETRY_AFTER)} if retry else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _disconnect(receive):
    """Returns when the client closes its connection (the ASGI server's
    ``http.disconnect``; the body must have been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Service:
    """One translator behind the endpoints.

    Args:
        load: ``load()`` → a translator (``Translator`` or
            ``CTranslate2Translator``); run in the search thread.
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
        self._load = load
        self.on_ready, self.on_failure = on_ready, on_failure
        self.limits = None
        self.executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="kt-serve-search"
        )
        self.batcher = None
        self.metrics = Metrics(lambda: self.batcher.queued if self.batcher else 0)

    def app(self):
        """The Starlette application."""
        routes = [
            Route("/translate", self._counted(self.translate), methods=["POST"]),
            Route("/health", self._counted(self.health), methods=["GET"]),
            Route("/metrics", self._counted(self.scrape), methods=["GET"]),
        ]
        return Starlette(
            routes=routes,
            lifespan=self._lifespan,
            exception_handlers={HTTPException: self._http_error},
        )

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
        # A call's sentences are sorted by length and searched in groups of
        # search_batch_size, each padded to that many rows: a Keras
        # translator then compiles one search per width, all of them now
        # (for the default beam size), not one of several seconds whenever
        # a group of a new size arrives.
        search = translator.search_options(
            batch_size=min(
                self.settings.search_batch_size, self.settings.max_batch_size
            ),
            fixed_batch=True,
        )
        self.limits = Limits(
            max_texts=self.settings.max_texts,
            max_tokens=translator.source_max_length or sys.maxsize,
            max_beam_size=self.settings.max_beam_size,
            search=search,
        )
        translator.warm_up(search)
        self.translator = translator

    def _count_tokens(self, texts):
        # Counted with sentencepiece, not the engine's tokenizer (keras-hub's
        # runs TensorFlow ops): the request is parsed on the event loop.
        return self.translator.source_lengths(texts)

    def _translate(self, texts, search):
        return self.translator.translate(texts, search)

    # -- endpoints --------------------------------------------------------------

    def _counted(self, endpoint):
        async def counted(request):
            response = await endpoint(request)
            self.metrics.requests.labels(request.url.path, response.status_code).inc()
            return response

        return counted

    async def _http_error(self, request, error):
        response = _error(error.status_code, error.detail)
        # Any path may be asked for; one series per path would grow without
        # bound.
        path = request.url.path if request.url.path in PATHS else "other"
        self.metrics.requests.labels(path, error.status_code).inc()
        return response

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
            }
        )

    async def scrape(self, request):
        body, content_type = self.metrics.text()
        return Response(body, media_type=content_type)

    async def translate(self, request):
        start = time.monotonic()
        response = await self._translate_response(request)
        self.metrics.latency.observe(time.monotonic() - start)
        return response

    async def _translate_response(self, request):
        if self.state != "ready":
            self.metrics.errors.labels("not_ready").inc()
            return _error(503, f"the model is {self.state}", retry=True)
        try:
            parsed = parse_translate(
                await self._body(request), self.limits, self._count_tokens
            )
        except RequestError as error:
            self.metrics.errors.labels("bad_request").inc()
            return _error(error.status, error.message)
        job = asyncio.ensure_future(self.batcher.submit(parsed.texts, parsed.search))
        gone = asyncio.ensure_future(_disconnect(request.receive))
        await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not job.done():
            # Its job stays queued, cancelled: the batcher skips it.
            job.cancel()
            self.metrics.errors.labels("disconnected").inc()
            return Response(status_code=CLIENT_CLOSED)
        try:
            translations = job.result()
        except QueueFull as error:
            self.metrics.errors.labels("queue_full").inc()
            return _error(503, f"the server is busy: {error}", retry=True)
        except SearchFailed as error:
            self.metrics.errors.labels("search_failed").inc()
            traceback.print_exception(error.cause, file=sys.stderr)
            return _error(500, f"the search of this request's batch failed: {error}")
        self.metrics.sentences.inc(len(translations))
        return JSONResponse(
            {"translations": translations, "model": self.name, "version": self.version}
        )

    async def _body(self, request):
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise RequestError(413, f"the body is {declared} bytes; at most {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"the body is over {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
