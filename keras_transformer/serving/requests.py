"""What a ``POST /translate`` may ask, checked before it is queued.

A bad request is answered at once with a 4xx status and a JSON error that
names the problem (the field, the index of the text); it never reaches the
queue, so it cannot hold up or break anyone else's batch. Messages quote at
most a short prefix of what was sent: a 900 KB field name is not echoed.

Two request shapes share the checks: this package's ``{"texts": [...]}``
(here) and LibreTranslate's ``q`` (``serving/libretranslate.py``). Either
may carry a ``glossary``, which ``constrain`` (``serving/glossaries.py``)
checks and turns into each text's constraints.
"""

import dataclasses
import json
import urllib.parse

from keras_transformer.search.options import SearchOptions

# What a request may say about its search; the rest is the server's.
SEARCH_FIELDS = ("beam_size", "length_penalty")
# The API key may come in any request's fields, as LibreTranslate reads it.
KEY_FIELD = "api_key"
# {"source term": "target term"} for every text of the request.
GLOSSARY_FIELD = "glossary"
OPTIONS = ("texts", *SEARCH_FIELDS, GLOSSARY_FIELD, KEY_FIELD)
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
            (its sentences' tokens, end tokens included, summed, plus
            ``CONSTRAINT_COST`` per glossary token they bring): one request
            cannot hold the search thread for long.
        max_chars: the most characters of text per request, or None.
        search: the ``SearchOptions`` of a request that sets none (the
            paper's 4 beams and α = 0.6, with the server's batch settings);
            a request's ``beam_size`` and ``length_penalty`` replace them.
        glossary_max_tokens: the most target tokens the glossary terms
            found in one text may bring, or 0: no glossaries (the server
            compiled the constrained searches up to it at warm-up).
        glossary_max_entries, glossary_max_term_chars: the most entries of
            a glossary, and characters of one of its terms.
    """

    max_texts: int
    max_tokens: int
    beam_sizes: tuple = (4,)
    max_cost: int = 1 << 62
    max_chars: int | None = None
    search: SearchOptions = SearchOptions()
    glossary_max_tokens: int = 0
    glossary_max_entries: int = 1000
    glossary_max_term_chars: int = 100


@dataclasses.dataclass(frozen=True)
class TranslateRequest:
    """A request checked: what to search and how to answer.

    ``sources`` are the texts' ids as they are searched (the encoding that
    admitted them: a text is encoded once). ``n`` is None for the best
    translation of each text, or how many of the best to give (``n_best``).
    ``answer(results, missed=None)`` makes the JSON body from the search's
    results, one per text, and, where a glossary was sent, the target terms
    each translation missed (one list per text).

    ``terms`` is None without a glossary, else per text the target terms of
    the glossary's entries found in it; ``constraints`` is None where no
    text has any, else per source the id phrases of its ``terms``, in their
    order (what the search must put in the translation)."""

    texts: list
    sources: list
    search: SearchOptions
    n: int | None = None
    target_language: str | None = None
    answer: object = None
    terms: list | None = None
    constraints: list | None = None


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


def parse_translate(fields, limits, encode, constrain=None):
    """The ``TranslateRequest`` of this package's request shape.

    Args:
        fields: the request's fields (``read_fields``).
        limits: ``Limits``.
        encode: ``encode(texts, target_language=None)`` → each text's ids
            as the model reads them (a target-language token, if any, and
            the end id included), not cut: ``RequestError`` for texts the
            model cannot be given.
        constrain: ``constrain(texts, glossary, name)`` → ``(terms,
            constraints)`` as ``TranslateRequest`` holds them, for a
            glossary sent (``glossaries.constrain``; ``name`` is the texts'
            field, for messages); None: a glossary is refused.
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
    terms, constraints = glossary_of(fields, texts, "texts", constrain)
    check_cost(sources, search, limits, constraints)
    return TranslateRequest(
        texts, sources, search, answer=translations, terms=terms,
        constraints=constraints,
    )  # fmt: skip


def translations(results, missed=None):
    """This package's answer: ``{"translations": [...]}``, and the terms
    each missed where a glossary was sent."""
    answer = {"translations": results}
    if missed is not None:
        answer["glossary_missed"] = missed
    return answer


def glossary_of(fields, texts, name, constrain):
    """``(terms, constraints)`` of the request's glossary (``constrain``'s),
    or ``(None, None)`` where it sends none (absent or null)."""
    glossary = fields.get(GLOSSARY_FIELD)
    if glossary is None:
        return None, None
    if constrain is None:
        raise RequestError(400, "this server takes no glossary")
    return constrain(texts, glossary, name)


EXPLAIN_OPTIONS = ("text", *SEARCH_FIELDS, GLOSSARY_FIELD, KEY_FIELD)


def parse_explain(fields, limits, encode, constrain=None):
    """The ``TranslateRequest`` of ``POST /explain`` (the page's): one
    ``text``, searched for all ``beam_size`` best translations
    (``constrain`` as for ``parse_translate``)."""
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
    terms, constraints = glossary_of(fields, [text], "text", constrain)
    check_cost(sources, search, limits, constraints)
    return TranslateRequest(
        [text], sources, search, n=search.beam_size, terms=terms,
        constraints=constraints,
    )  # fmt: skip


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


# What one glossary token (a target token a translation must hold) costs, in
# source tokens. Measured on the numbers model with 4 beams, 8 sentences of
# 12 tokens on average: made to hold 9 (23) tokens each, their search took
# 2.1 (4.6) times as long as without; at 2 a token, the cost grows 2.5
# (4.8) times.
CONSTRAINT_COST = 2


def check_cost(sources, search, limits, constraints=None):
    """Refuses a request whose tokens × beam size exceed ``max_cost``: its
    source tokens, plus ``CONSTRAINT_COST`` per token of its
    ``constraints`` (per source, id phrases, or None)."""
    tokens = sum(len(ids) for ids in sources)
    held = sum(len(p) for row in constraints or () for p in row)
    cost = (tokens + CONSTRAINT_COST * held) * search.beam_size
    if cost <= limits.max_cost:
        return
    asked, advice = f"{tokens} tokens", "fewer texts or a smaller beam"
    if held:
        asked = f"({tokens} source tokens + {CONSTRAINT_COST} × {held} glossary tokens)"
        advice = "fewer texts, a smaller beam or fewer glossary terms"
    raise RequestError(
        413,
        f"the request asks for {asked} × beam_size {search.beam_size} = "
        f"{cost}; this server takes at most {limits.max_cost} per request "
        f"(send {advice})",
    )
