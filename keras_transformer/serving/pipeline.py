"""A translating request's way through the server: read → identify and
limit → parse, admit and encode once → search → answer.

Only the steps that wait on others run on the event loop: reading the
body, the limits' storage, the batcher's queue. Parsing (HTML markup
included) and encoding run on a parse thread, so that no request's text,
however it is written, holds up the loop that answers everyone else (and
``/health``); the search runs on the search thread, in turn.
"""

import asyncio

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from keras_transformer.serving import errors
from keras_transformer.serving.connections import BODY_TIMED_OUT
from keras_transformer.serving.glossaries import split_missed
from keras_transformer.serving.requests import RequestError, read_fields


async def _disconnect(receive):
    """Returns when the client closes its connection (the ASGI server's
    ``http.disconnect``; the body must have been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Pipeline:
    """The steps of a translating request.

    Args:
        callers: the server's ``Callers``.
        batcher: ``batcher()`` → the running ``Batcher``.
        metrics: the server's ``Metrics``.
        max_body_bytes: the largest body read.
        parse_executor: where parsing and encoding run.
        search_executor: the search thread (``/explain``'s maps run there).
    """

    def __init__(
        self, callers, batcher, metrics, max_body_bytes, parse_executor,
        search_executor,
    ):  # fmt: skip
        self.callers = callers
        self._batcher = batcher
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.parse_executor = parse_executor
        self.search_executor = search_executor

    async def answer(self, request, parse, finish=None):
        """The answer to ``request``: ``parse(fields)`` → a
        ``TranslateRequest``; ``finish(parsed, results, missed)``, if given,
        runs on the search thread and makes the body (``missed``: as
        ``TranslateRequest.answer`` takes it)."""
        caller = "anonymous"
        loop = asyncio.get_running_loop()
        try:
            fields = read_fields(
                await self.body(request),
                request.headers.get("content-type", ""),
                request.url.query,
            )
            caller = await self.callers.identify(request, fields)
            await self.callers.limit(request, caller)
            parsed = await loop.run_in_executor(self.parse_executor, parse, fields)
        except RequestError as error:
            return errors.refused(self.metrics, caller, error)
        except ClientDisconnect:
            # The client went away before its body's end, or the server gave
            # up waiting for it (the body timeout: answered 408 and closed).
            if request.scope.get(BODY_TIMED_OUT):
                return errors.body_timed_out(self.metrics)
            return errors.gone(self.metrics)
        response = await self._search(request, parsed, finish)
        self.metrics.callers.labels(caller, response.status_code).inc()
        return response

    async def _search(self, request, parsed, finish):
        if not parsed.texts:
            # Markup without text.
            return JSONResponse(parsed.answer(*split_missed(parsed, [])))
        # The target language is in the sources' ids: requests into any of a
        # model's languages share a batch. Requests with constraints share
        # batches with one another only: a constrained search is another
        # program, slower, and does not search a row without constraints
        # exactly as the plain one does (with one beam it is a beam search,
        # not the greedy one), so the others are answered as without
        # glossaries whatever arrives beside them.
        constrained = parsed.constraints is not None
        sources = (
            list(zip(parsed.sources, parsed.constraints, strict=True))
            if constrained
            else parsed.sources
        )
        options = (parsed.search, parsed.n, constrained)
        job = asyncio.ensure_future(self._batcher().submit(sources, options))
        gone = asyncio.ensure_future(_disconnect(request.receive))
        await asyncio.wait({job, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not job.done():
            # Its job stays queued, cancelled: the batcher skips it.
            job.cancel()
            return errors.gone(self.metrics)
        try:
            results = job.result()
        except Exception as failure:  # the batcher's, mapped in errors
            return errors.search_error(self.metrics, failure)
        self.metrics.sentences.inc(len(results))
        results, missed = split_missed(parsed, results)
        if finish is not None:
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(
                self.search_executor, finish, parsed, results, missed
            )
            return JSONResponse(body)
        return JSONResponse(parsed.answer(results, missed))

    async def body(self, request):
        """The body's bytes, at most ``max_body_bytes``; 413 beyond (from
        a declared length at once, else when the limit is passed)."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
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
