"""Serving a translator over HTTP with dynamic batching (``kt-serve``): a
page for people, this package's API and LibreTranslate's, API keys and rate
limits.

Needs the ``serve`` extra (Starlette, uvicorn, prometheus-client). Names are
imported when first used: the request parsers, the keys and the batcher
need none of those packages.
"""

from keras_transformer import _lazy

_PUBLIC = {
    "KeyRing": "keras_transformer.serving.access",
    "LimitStorageError": "keras_transformer.serving.access",
    "RateLimiter": "keras_transformer.serving.access",
    "Service": "keras_transformer.serving.app",
    "Settings": "keras_transformer.serving.settings",
    "Aborted": "keras_transformer.serving.batcher",
    "Batcher": "keras_transformer.serving.batcher",
    "QueueFull": "keras_transformer.serving.batcher",
    "SearchFailed": "keras_transformer.serving.batcher",
    "HtmlDocument": "keras_transformer.serving.html_text",
    "parse_libretranslate": "keras_transformer.serving.libretranslate",
    "Limits": "keras_transformer.serving.requests",
    "RequestError": "keras_transformer.serving.requests",
    "parse_explain": "keras_transformer.serving.requests",
    "parse_translate": "keras_transformer.serving.requests",
    "read_fields": "keras_transformer.serving.requests",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = _lazy.attributes(__name__, _PUBLIC)
