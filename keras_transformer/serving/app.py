"""The HTTP application's routes: ``GET /``, ``POST /translate``, ``POST
/explain``, ``GET /languages``, ``GET /health``, ``GET /metrics``.

A Starlette app served by uvicorn (``kt-serve``; ``docs/design.md`` says why
those). The parts it routes to have their own modules: the settings
(``settings``), the translator and its warm-up (``searcher``), who may ask
(``callers``), a request's way through (``pipeline``), the batching
(``batcher``) and what each failure answers (``errors``). The translator is
loaded and warmed up in the search thread after the server starts, so
``/health`` says "loading" (503) until it is ready.
"""

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import sys

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from keras_transformer.serving import errors
from keras_transformer.serving.batcher import Batcher
from keras_transformer.serving.callers import Callers
from keras_transformer.serving.explain import explanation
from keras_transformer.serving.libretranslate import (
    is_libretranslate,
    languages_answer,
    parse_libretranslate,
)
from keras_transformer.serving.metrics import Metrics
from keras_transformer.serving.page import page_html
from keras_transformer.serving.pipeline import Pipeline
from keras_transformer.serving.requests import (
    RequestError,
    parse_explain,
    parse_translate,
    read_fields,
    translations,
)
from keras_transformer.serving.searcher import Searcher
from keras_transformer.serving.settings import Settings

PATHS = ("/", "/translate", "/explain", "/languages", "/health", "/metrics")
# LibreTranslate's endpoints that a one-pair model server does not offer
# (docs/known-issues.md): answered 501 in its error shape, not 404.
NOT_OFFERED = ("/detect", "/translate_file", "/suggest")


def compilations():
    """The programs this process has compiled (``backend.compilations``):
    0 where no backend was imported, as for a CTranslate2 export, which the
    server serves without Keras."""
    backend = sys.modules.get("keras_transformer.backend")
    return backend.compilations() if backend is not None else 0


class Service:
    """One translator behind the endpoints.

    Args:
        load: ``load()`` → an engine of the translator interface
            (``translate.base``); run in the search thread.
        name, version: what answers say they come from.
        settings: ``Settings``.
        on_ready: optional ``on_ready()``, once the translator is warm.
        on_failure: optional ``on_failure(error)``, if loading raised.

    Raises ``access.KeyFileError`` for a key file it cannot use, and
    ``ValueError`` for a limits storage it does not know.
    """

    def __init__(
        self, load, name, version, settings=None, on_ready=None, on_failure=None
    ):
        self.settings = settings or Settings()
        self.name, self.version = name, version
        self.on_ready, self.on_failure = on_ready, on_failure
        self.executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="kt-serve-search"
        )
        self.parse_executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="kt-serve-parse"
        )
        self.batcher = None
        self.metrics = Metrics(
            lambda: self.batcher.queued if self.batcher else 0, compilations
        )
        self.searcher = Searcher(load, self.settings, self.metrics)
        self.callers = Callers(self.settings)
        self.pipeline = Pipeline(
            self.callers,
            lambda: self.batcher,
            self.metrics,
            self.settings.max_body_bytes,
            self.parse_executor,
            self.executor,
        )

    @property
    def state(self):
        """``"loading"``, ``"ready"`` or ``"failed"``."""
        return self.searcher.state

    @property
    def error(self):
        """Why loading failed, or None."""
        return self.searcher.error

    @property
    def translator(self):
        return self.searcher.translator

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

    def invalid_request(self):
        """Counts a request that was not HTTP (``connections``' 400)."""
        self.metrics.requests.labels("other", 400).inc()
        self.metrics.errors.labels("bad_http").inc()

    # -- life -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        settings = self.settings
        self.batcher = Batcher(
            self.searcher.search,
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
            self.parse_executor.shutdown(wait=False, cancel_futures=True)
            await self.callers.close()

    async def _start(self):
        searcher = self.searcher
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, searcher.load_and_warm_up)
        except Exception as error:
            searcher.state, searcher.error = (
                "failed",
                f"{type(error).__name__}: {error}",
            )
            if self.on_failure is not None:
                self.on_failure(error)
            return
        self.metrics.warmed_up(compilations())
        searcher.state = "ready"
        if self.on_ready is not None:
            self.on_ready()

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
        self.metrics.requests.labels(self._path(request), error.status_code).inc()
        return errors.error(error.status_code, error.detail)

    async def _server_error(self, request, exception):
        self.metrics.requests.labels(self._path(request), 500).inc()
        return errors.internal(self.metrics, exception)

    async def page(self, request):
        return HTMLResponse(page_html())

    async def not_offered(self, request):
        return errors.error(
            501,
            f"{request.url.path} (LibreTranslate's) is not offered by kt-serve: "
            "it translates one language pair, with no language detection, file "
            "translation or suggestions",
        )

    async def health(self, request):
        searcher = self.searcher
        if self.state != "ready":
            body = {"status": self.state}
            if searcher.error:
                body["error"] = searcher.error
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse(
            {
                "status": "ready",
                "model": self.name,
                "version": self.version,
                "engine": searcher.translator.engine,
                "languages": list(searcher.languages) if searcher.languages else None,
                "beam_sizes": list(searcher.limits.beam_sizes),
                "beam_size": searcher.limits.search.beam_size,
                "attention": searcher.translator.gives_attention,
                "glossary": searcher.takes_glossaries,
                "api_key_required": self.callers.need_keys,
            }
        )

    async def languages_list(self, request):
        if self.state != "ready":
            return errors.not_ready(self.metrics, self.state)
        return JSONResponse(
            languages_answer(self.searcher.languages, self.translator.target_languages)
        )

    async def scrape(self, request):
        caller = "anonymous"
        try:
            fields = read_fields(b"", "", request.url.query)
            caller = await self.callers.identify(request, fields)
        except RequestError as error:
            return errors.refused(self.metrics, caller, error)
        self.metrics.callers.labels(caller, 200).inc()
        body, content_type = self.metrics.text()
        return Response(body, media_type=content_type)

    async def translate(self, request):
        if self.state != "ready":
            return errors.not_ready(self.metrics, self.state)
        with self.metrics.latency.time():
            return await self.pipeline.answer(request, self._parse_translate)

    async def explain(self, request):
        if self.state != "ready":
            return errors.not_ready(self.metrics, self.state)
        return await self.pipeline.answer(
            request, self._parse_explain, self._explanation
        )

    # -- what the pipeline calls ------------------------------------------------

    def _parse_translate(self, fields):
        searcher = self.searcher
        if is_libretranslate(fields):
            return parse_libretranslate(
                fields,
                searcher.limits,
                searcher.encode,
                searcher.languages,
                self.translator.target_languages,
                searcher.constrain,
            )
        parsed = parse_translate(
            fields, searcher.limits, searcher.encode, searcher.constrain
        )
        return dataclasses.replace(parsed, answer=self._stamped)

    def _stamped(self, results, missed=None):
        # This package's answer says which model gave it.
        answer = translations(results, missed)
        return {**answer, "model": self.name, "version": self.version}

    def _parse_explain(self, fields):
        searcher = self.searcher
        return parse_explain(
            fields, searcher.limits, searcher.encode, searcher.constrain
        )

    def _explanation(self, parsed, results, missed):
        # The attention runs the model: on the search thread, in turn.
        answer = explanation(self.translator, parsed.texts[0], results[0])
        if missed is not None:
            answer["glossary_missed"] = missed[0]
        return answer
