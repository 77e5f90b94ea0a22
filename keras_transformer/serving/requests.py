"""What a ``POST /translate`` may ask, checked before it is queued.

A bad request is answered at once with a 4xx status and a JSON error that
names the problem (the field, the index of the text); it never reaches the
queue, so it cannot hold up or break anyone else's batch. Messages quote at
most a short prefix of what was sent: a 900 KB field name is not echoed.

Two request shapes share the checks: this package's ``{"texts": [...]}``
(here) and LibreTranslate's ``q`` (``serving/libretranslate.py``).
"""

import dataclasses
import json
import urllib.parse

from keras_transformer.search.options import SearchOptions

# What a request may say about its search; the rest is the server's.
SEARCH_FIELDS = ("beam_size", "length_penalty")
# The API key may come in any request's fields, as LibreTranslate reads it.
KEY_FIELD = "api_key"
OPTIONS = ("texts", *SEARCH_FIELDS, KEY_FIELD)
# Characters of a client's value quoted back in an error message.
SHOWN = 40


class RequestError(Exception):
    """A request refused with HTTP ``status`` and ``message``; ``kind``
    names it in the metrics, ``retry_after`` (seconds) is for 429s."""

    def __init__(self, status, message, kind="bad_request", retry_after=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.retry_after = retry_after


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask.

    Attributes:
        max_texts: texts per request.
        max_tokens: tokens per text, its end token included (the model's
            ``max_length``); a longer text is refused, not cut.
        beam_sizes: the beam sizes a request may ask (the server compiled
            their searches at warm-up; any other is refused rather than
            compiled on the search thread while everyone waits).
        max_cost: the most source tokens × beam size one request may ask
            (its sentences' tokens, end tokens included, summed): one
            request cannot hold the search thread for long.
        max_chars: the most characters of text per request, or None.
        search: the ``SearchOptions`` of a request that sets none (the
            paper's 4 beams and α = 0.6, with the server's batch settings);
            a request's ``beam_size`` and ``length_penalty`` replace them.
    """

    max_texts: int
    max_tokens: int
    beam_sizes: tuple = (4,)
    max_cost: int = 1 << 62
    max_chars: int | None = None
    search: SearchOptions = SearchOptions()


@dataclasses.dataclass(frozen=True)
class TranslateRequest:
    """A request checked: what to search and how to answer.

    ``sources`` are the texts' ids as they are searched (the encoding that
    admitted them: a text is encoded once). ``n`` is None for the best
    translation of each text, or how many of the best to give (``n_best``).
    ``answer(results)`` makes the JSON body from the search's results, one
    per text."""

    texts: list
    sources: list
    search: SearchOptions
    n: int | None = None
    target_language: str | None = None
    answer: object = None


def shown(value):
    """``value`` quoted for a message: at most ``SHOWN`` characters."""
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:SHOWN] + "…") if len(text) > SHOWN else repr(text)


def json_type(value):
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def _text(body):
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(
            400, f"the body is not valid UTF-8 (byte {error.start}: {error.reason})"
        ) from None


def read_json(body):
    """The JSON value of ``body`` (bytes), or ``RequestError``."""
    try:
        return json.loads(_text(body))
    except json.JSONDecodeError as error:
        raise RequestError(
            400,
            f"the body is not JSON: {error.msg} (line {error.lineno}, column "
            f"{error.colno})",
        ) from None
    except RecursionError:
        raise RequestError(400, "the body's JSON is nested too deeply") from None
    except ValueError as error:
        # Python refuses integers of more than 4,300 digits.
        raise RequestError(
            400, f"the body has a number out of range ({error})"
        ) from None


def read_fields(body, content_type, query):
    """The request's fields, where LibreTranslate reads them: the query
    string, then a form body or a JSON object body (which win).

    Args:
        body: the body's bytes.
        content_type: the ``Content-Type`` header ("" if none).
        query: the query string (str).
    """
    fields = _form(query, "the query string")
    media = content_type.split(";")[0].strip().lower()
    # curl -d sends JSON labelled as a form; no form body starts with "{".
    if media == "application/x-www-form-urlencoded" and not body.lstrip().startswith(
        b"{"
    ):
        fields.update(_form(_text(body), "the form body"))
    elif media == "multipart/form-data":
        raise RequestError(
            415, "multipart bodies are not read: send a form or JSON body"
        )
    elif body.strip():
        data = read_json(body)
        if not isinstance(data, dict):
            raise RequestError(
                400,
                'the body must be a JSON object {"texts": [...]}, not '
                + json_type(data),
            )
        fields.update(data)
    return fields


def _form(text, where):
    try:
        pairs = urllib.parse.parse_qsl(
            text, keep_blank_values=True, strict_parsing=False, max_num_fields=1000
        )
    except ValueError as error:
        raise RequestError(400, f"{where} cannot be read: {error}") from None
    return dict(pairs)


def parse_translate(fields, limits, encode):
    """The ``TranslateRequest`` of this package's request shape.

    Args:
        fields: the request's fields (``read_fields``).
        limits: ``Limits``.
        encode: ``encode(texts, target_language=None)`` → each text's ids
            as the model reads them (a target-language token, if any, and
            the end id included), not cut: ``RequestError`` for texts the
            model cannot be given.
    """
    unknown = sorted(set(fields) - set(OPTIONS))
    if unknown:
        names = ", ".join(shown(name) for name in unknown[:5])
        raise RequestError(
            400, f"unknown option(s) [{names}]; a request may have {list(OPTIONS)}"
        )
    if "texts" not in fields:
        raise RequestError(400, 'the body has no "texts" (a list of strings)')
    texts = fields["texts"]
    if not isinstance(texts, list):
        raise RequestError(
            400, f"texts must be a list of strings, not {json_type(texts)}"
        )
    search = search_of(fields, limits)
    sources = check_texts(texts, "texts", limits, encode)
    check_cost(sources, search, limits)
    return TranslateRequest(
        texts, sources, search, answer=lambda results: {"translations": results}
    )


EXPLAIN_OPTIONS = ("text", *SEARCH_FIELDS, KEY_FIELD)


def parse_explain(fields, limits, encode):
    """The ``TranslateRequest`` of ``POST /explain`` (the page's): one
    ``text``, searched for all ``beam_size`` best translations."""
    unknown = sorted(set(fields) - set(EXPLAIN_OPTIONS))
    if unknown:
        names = ", ".join(shown(name) for name in unknown[:5])
        raise RequestError(
            400, f"unknown option(s) [{names}]; it may have {list(EXPLAIN_OPTIONS)}"
        )
    text = fields.get("text")
    if not isinstance(text, str):
        raise RequestError(400, f"text must be a string, not {json_type(text)}")
    search = search_of(fields, limits)
    sources = check_texts([text], "text", limits, encode)
    check_cost(sources, search, limits)
    return TranslateRequest([text], sources, search, n=search.beam_size)


def search_of(fields, limits):
    """The ``SearchOptions`` the fields ask for, admitted by ``limits``."""
    asked = {name: fields[name] for name in SEARCH_FIELDS if name in fields}
    try:
        search = SearchOptions.of(limits.search, **asked)
    except (TypeError, ValueError) as error:
        # SearchOptions' message quotes the whole value; this one its
        # prefix (a JSON number may have thousands of digits).
        name = next((n for n in asked if str(error).startswith(n)), next(iter(asked)))
        reason = str(error).split(" Received:")[0].rstrip(".")
        raise RequestError(
            400, f"{reason[:120]}. Received: {name}={shown(asked[name])}"
        ) from None
    if search.beam_size not in limits.beam_sizes:
        raise RequestError(
            400,
            f"beam_size={shown(search.beam_size)} is not served here; this "
            f"server searches with beam_size in {list(limits.beam_sizes)}",
        )
    return search


def check_texts(texts, name, limits, encode, target_language=None):
    """Each text's ids (``encode``'s), once every text is checked: a
    non-empty list of at most ``max_texts`` str, each valid Unicode and at
    most ``max_tokens`` tokens long, at most ``max_chars`` in all. The
    cheap checks come first: nothing is encoded for a request they
    refuse."""
    if not texts:
        raise RequestError(400, f"{name} is empty: give at least one text")
    if len(texts) > limits.max_texts:
        raise RequestError(
            413,
            f"{len(texts)} texts in one request; this server takes at most "
            f"{limits.max_texts}",
        )
    for i, item in enumerate(texts):
        if not isinstance(item, str):
            raise RequestError(
                400, f"{name}[{i}] must be a string, not {json_type(item)}"
            )
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            # JSON may spell a lone surrogate (\ud800), which is no text.
            raise RequestError(
                400, f"{name}[{i}] is not valid Unicode (a lone surrogate)"
            ) from None
    chars = sum(len(text) for text in texts)
    if limits.max_chars is not None and chars > limits.max_chars:
        raise RequestError(
            413,
            f"the request has {chars} characters of text; this server takes "
            f"at most {limits.max_chars} (--char-limit)",
        )
    sources = encode(texts, target_language)
    for i, ids in enumerate(sources):
        if len(ids) > limits.max_tokens:
            raise RequestError(
                413,
                f"{name}[{i}] is {len(ids)} tokens long (its end token "
                f"included); the model takes at most {limits.max_tokens}",
            )
    return sources


def check_cost(sources, search, limits):
    """Refuses a request whose tokens × beam size exceed ``max_cost``."""
    counts = [len(ids) for ids in sources]
    cost = sum(counts) * search.beam_size
    if cost > limits.max_cost:
        raise RequestError(
            413,
            f"the request asks for {sum(counts)} tokens × beam_size "
            f"{search.beam_size} = {cost}; this server takes at most "
            f"{limits.max_cost} per request (send fewer texts or a smaller "
            "beam)",
        )
