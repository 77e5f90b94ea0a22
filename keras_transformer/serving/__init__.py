"""Serving a translator over HTTP with dynamic batching (``kt-serve``).

Needs the ``serve`` extra (Starlette, uvicorn, prometheus-client).
"""

from keras_transformer.serving.app import Service, Settings
from keras_transformer.serving.batcher import Batcher, QueueFull, SearchFailed
from keras_transformer.serving.requests import Limits, RequestError, parse_translate

__all__ = [
    "Batcher",
    "Limits",
    "QueueFull",
    "RequestError",
    "SearchFailed",
    "Service",
    "Settings",
    "parse_translate",
]
