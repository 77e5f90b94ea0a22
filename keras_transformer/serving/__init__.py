"""Serving a translator over HTTP with dynamic batching (``kt-serve``): a
page for people, this package's API and LibreTranslate's, API keys and rate
limits.

Needs the ``serve`` extra (Starlette, uvicorn, prometheus-client).
"""

from keras_transformer.serving.access import KeyRing, RateLimiter
from keras_transformer.serving.app import Service, Settings
from keras_transformer.serving.batcher import Aborted, Batcher, QueueFull, SearchFailed
from keras_transformer.serving.html_text import HtmlDocument
from keras_transformer.serving.libretranslate import parse_libretranslate
from keras_transformer.serving.requests import (
    Limits,
    RequestError,
    parse_explain,
    parse_translate,
    read_fields,
)

__all__ = [
    "Aborted",
    "Batcher",
    "HtmlDocument",
    "KeyRing",
    "Limits",
    "QueueFull",
    "RateLimiter",
    "RequestError",
    "SearchFailed",
    "Service",
    "Settings",
    "parse_explain",
    "parse_libretranslate",
    "parse_translate",
    "read_fields",
]
