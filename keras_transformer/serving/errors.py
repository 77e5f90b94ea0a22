"""What each failure is answered with: the status, the JSON body, and the
kind it is counted as in ``kt_serve_errors``.

Every answer of the server is JSON but ``/metrics`` and the page: a
refused request (``RequestError``, raised where the request is read and
checked), the batcher's refusals and failures, an HTTP error of the router,
an unexpected exception, and even a request that is not HTTP
(``connections``' 400). A client that goes away gets no answer, but its
request is counted: nginx's 499.
"""

import sys
import traceback

from starlette.responses import JSONResponse, Response

from keras_transformer.serving.batcher import Aborted, QueueFull, SearchFailed

# Seconds a client is asked to wait before it retries a 503.
RETRY_AFTER = 1
# HTTP has no code for "the client went away"; nginx's is the usual one.
CLIENT_CLOSED = 499
# What connections answers when a request's body does not arrive in time.
BODY_TIMEOUT = 408


def error(status, message, retry_after=None):
    """The JSON answer ``{"error": message}`` with ``status``."""
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def refused(metrics, caller, request_error):
    """The answer to a ``RequestError`` of ``caller``, counted by its kind
    and under its caller."""
    metrics.errors.labels(request_error.kind).inc()
    metrics.callers.labels(caller, request_error.status).inc()
    return error(request_error.status, request_error.message, request_error.retry_after)


def gone(metrics):
    """The client went away before its answer: counted, nothing sent."""
    metrics.errors.labels("disconnected").inc()
    return Response(status_code=CLIENT_CLOSED)


def body_timed_out(metrics):
    """``connections`` has answered 408 already; the app's answer, which
    is not sent, is what the metrics count."""
    metrics.errors.labels("body_timeout").inc()
    return Response(status_code=BODY_TIMEOUT)


def not_ready(metrics, state):
    metrics.errors.labels("not_ready").inc()
    return error(503, f"the model is {state}", retry_after=RETRY_AFTER)


def search_error(metrics, failure):
    """The answer to what the batcher raised instead of results."""
    if isinstance(failure, Aborted):
        metrics.errors.labels("aborted").inc()
        return error(503, str(failure), retry_after=RETRY_AFTER)
    if isinstance(failure, QueueFull):
        metrics.errors.labels("queue_full").inc()
        return error(503, f"the server is busy: {failure}", retry_after=RETRY_AFTER)
    if isinstance(failure, SearchFailed):
        metrics.errors.labels("search_failed").inc()
        traceback.print_exception(failure.cause, file=sys.stderr)
        return error(500, f"the search of this request's batch failed: {failure}")
    raise failure


def internal(metrics, exception):
    """An exception nothing expected (Starlette logs its traceback on
    stderr after this answer)."""
    metrics.errors.labels("internal").inc()
    return error(500, f"internal error ({type(exception).__name__})")
