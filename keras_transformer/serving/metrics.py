"""The server's metrics, in the Prometheus text format (``GET /metrics``).

A registry of its own per server, not prometheus_client's global one, so
that two servers in one process (tests) do not count into each other.
"""

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# Sentences per search call: powers of two up to the largest batches.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# Seconds: a greedy sentence takes milliseconds, a queue under load seconds.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0
)  # fmt: skip


class Metrics:
    """The counters of one server.

    ``requests`` (by path and status code), ``errors`` (by kind:
    ``bad_request``, ``bad_http``, ``forbidden``, ``auth_throttled``,
    ``rate_limited``, ``limits_down``, ``queue_full``, ``search_failed``,
    ``not_ready``, ``disconnected``, ``body_timeout``, ``aborted``,
    ``internal``), ``dropped`` (sentences of a running batch skipped because
    their client had gone), ``callers`` (requests to ``/translate``, ``/explain`` and
    ``/metrics`` by caller and status: an API key is named by its line in
    the key file, never by its value), ``sentences`` translated, ``batch_sentences`` and
    ``search_seconds`` per search call, ``latency`` of ``/translate``
    requests, ``queue`` (sentences waiting, read when scraped) and
    ``compilations`` (programs compiled since warm-up: 0, unless a request
    reached a shape or option warm-up did not foresee).

    Args:
        queued: ``queued()`` → the sentences waiting.
        compilations: ``compilations()`` → the programs this process has
            compiled (``backend.compilations``).
    """

    def __init__(self, queued, compilations=lambda: 0):
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "kt_serve_requests", "HTTP requests answered.", ["path", "code"],
            registry=registry,
        )  # fmt: skip
        self.errors = Counter(
            "kt_serve_errors", "Requests not translated, by why.", ["kind"],
            registry=registry,
        )  # fmt: skip
        self.callers = Counter(
            "kt_serve_caller_requests",
            "Requests to /translate, /explain and /metrics by caller (an API "
            "key's line in the key file, or anonymous) and status code.",
            ["caller", "code"], registry=registry,
        )  # fmt: skip
        self.dropped = Counter(
            "kt_serve_dropped_sentences",
            "Sentences of a running batch not searched: their client had gone.",
            registry=registry,
        )
        self.sentences = Counter(
            "kt_serve_sentences", "Sentences translated.", registry=registry
        )
        self.batch_sentences = Histogram(
            "kt_serve_batch_sentences", "Sentences per search call.",
            buckets=BATCH_BUCKETS, registry=registry,
        )  # fmt: skip
        self.search_seconds = Histogram(
            "kt_serve_search_seconds", "Seconds per search call.",
            buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
            "kt_serve_request_latency_seconds",
            "Seconds from a /translate request's arrival to its answer.",
            buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        queue = Gauge(
            "kt_serve_queue_sentences", "Sentences waiting for a search.",
            registry=registry,
        )  # fmt: skip
        queue.set_function(queued)
        self._compilations = compilations
        self._warm = None
        compiled = Gauge(
            "kt_serve_compilations_after_warm_up",
            "Programs compiled since the warm-up (each held the search thread).",
            registry=registry,
        )
        compiled.set_function(
            lambda: 0 if self._warm is None else self._compilations() - self._warm
        )

    def warmed_up(self, compilations):
        """From now on compilations count: ``compilations`` were warm-up's."""
        self._warm = compilations

    def batch(self, sentences, seconds):
        self.batch_sentences.observe(sentences)
        self.search_seconds.observe(seconds)

    def text(self):
        """``(body, content_type)`` of a scrape."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
