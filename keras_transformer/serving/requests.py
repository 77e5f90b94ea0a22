"""What a ``POST /translate`` body may be, checked before it is queued.

A bad request is answered at once with a 4xx status and a JSON error that
names the problem (the field, the index of the text); it never reaches the
queue, so it cannot hold up or break anyone else's batch.
"""

import dataclasses
import json

from keras_transformer.search.options import SearchOptions

# What a request may say about its search; the rest is the server's.
SEARCH_FIELDS = ("beam_size", "length_penalty")
OPTIONS = ("texts", *SEARCH_FIELDS)


class RequestError(Exception):
    """A request refused with HTTP ``status`` and ``message``."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask.

    Attributes:
        max_texts: texts per request.
        max_tokens: tokens per text, its end token included (the model's
            ``max_length``); a longer text is refused, not cut.
        max_beam_size: the largest ``beam_size``.
        search: the ``SearchOptions`` of a request that sets none (the
            paper's 4 beams and α = 0.6, with the server's batch settings);
            a request's ``beam_size`` and ``length_penalty`` replace them.
    """

    max_texts: int
    max_tokens: int
    max_beam_size: int
    search: SearchOptions = SearchOptions()


@dataclasses.dataclass(frozen=True)
class TranslateRequest:
    texts: list
    search: SearchOptions


def _json_type(value):
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def parse_translate(body, limits, count_tokens):
    """The ``TranslateRequest`` of a body (bytes), or ``RequestError``.

    Args:
        body: the request's bytes.
        limits: ``Limits``.
        count_tokens: ``count_tokens(texts)`` → each text's token count,
            its end token included.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(
            400, f"the body is not valid UTF-8 (byte {error.start}: {error.reason})"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(
            400,
            f"the body is not JSON: {error.msg} (line {error.lineno}, column "
            f"{error.colno})",
        ) from None
    except RecursionError:
        raise RequestError(400, "the body's JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise RequestError(
            400,
            'the body must be a JSON object {"texts": [...]}, not ' + _json_type(data),
        )
    unknown = sorted(set(data) - set(OPTIONS))
    if unknown:
        raise RequestError(
            400, f"unknown option(s) {unknown}; a request may have {list(OPTIONS)}"
        )
    texts = _texts(data, limits, count_tokens)
    asked = {name: data[name] for name in SEARCH_FIELDS if name in data}
    try:
        search = SearchOptions.of(limits.search, **asked)
    except (TypeError, ValueError) as error:
        raise RequestError(400, str(error)) from None
    if search.beam_size > limits.max_beam_size:
        raise RequestError(
            400,
            f"beam_size={search.beam_size} is more than this server's maximum "
            f"{limits.max_beam_size}",
        )
    return TranslateRequest(texts, search)


def _texts(data, limits, count_tokens):
    if "texts" not in data:
        raise RequestError(400, 'the body has no "texts" (a list of strings)')
    texts = data["texts"]
    if not isinstance(texts, list):
        raise RequestError(
            400, f"texts must be a list of strings, not {_json_type(texts)}"
        )
    if not texts:
        raise RequestError(400, "texts is empty: give at least one text")
    if len(texts) > limits.max_texts:
        raise RequestError(
            413,
            f"{len(texts)} texts in one request; this server takes at most "
            f"{limits.max_texts}",
        )
    for i, item in enumerate(texts):
        if not isinstance(item, str):
            raise RequestError(
                400, f"texts[{i}] must be a string, not {_json_type(item)}"
            )
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            # JSON may spell a lone surrogate (\ud800), which is no text.
            raise RequestError(
                400, f"texts[{i}] is not valid Unicode (a lone surrogate)"
            ) from None
    for i, count in enumerate(count_tokens(texts)):
        if count > limits.max_tokens:
            raise RequestError(
                413,
                f"texts[{i}] is {count} tokens long (its end token included); "
                f"the model takes at most {limits.max_tokens}",
            )
    return texts
