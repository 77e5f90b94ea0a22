"""LibreTranslate's API on top of ours, for the clients that speak it.

Apps, browser extensions, SearXNG and libraries (``libretranslatepy``,
``deep-translator``, the npm ``libretranslate`` package) talk to a
LibreTranslate server: ``POST /translate`` with ``q`` (a string or a list of
strings), ``source``, ``target``, ``format`` (``text`` or ``html``),
``api_key`` and ``alternatives``, in a JSON body, a form body or the query
string; the answer is ``{"translatedText": ...}`` (a list for a list), with
``"alternatives"`` when asked; ``GET /languages`` lists the pairs; errors
are ``{"error": ...}``. A ``kt-serve`` that answers the same way stands in
for a LibreTranslate instance, with a model trained, fine-tuned or imported
here.

A model translates one pair, so ``source`` must be its source language (or
``"auto"``, taken to mean it: there is no language detection) and
``target`` its target (one of its target languages, for a model that
translates into several). ``format: "html"`` translates each run of text
between tags and keeps the markup (``serving/html_text.py``).

One field is this server's own: ``glossary``, as in this package's API
(``serving/glossaries.py``). A request that sends one gets
``"glossaryMissed"`` in its answer, the target terms each translation
misses (a list per ``q``, or one list for a single ``q``); a request
without one is answered as LibreTranslate would.
"""

from keras_transformer.data.languages import language_name
from keras_transformer.serving.html_text import HtmlDocument
from keras_transformer.serving.requests import (
    GLOSSARY_FIELD,
    KEY_FIELD,
    RequestError,
    TranslateRequest,
    check_cost,
    check_texts,
    glossary_of,
    json_type,
    search_of,
    shown,
)

FIELDS = ("q", "source", "target", "format", "alternatives", GLOSSARY_FIELD, KEY_FIELD)
FORMATS = ("text", "html")
# LibreTranslate's own cap on alternatives.
MAX_ALTERNATIVES = 3
# Characters of markup a request may send with format "html", checked first
# because the markup is parsed before any other limit applies; parsing takes
# time linear in it (tens of milliseconds for 100,000 characters, malformed
# or not).
MAX_MARKUP = 100_000


def languages_answer(languages, target_languages):
    """``GET /languages``: each language with the codes it translates into.

    Args:
        languages: the model's ``(source, target)`` codes, or None.
        target_languages: the codes of a model that translates into several
            (its target-language tokens), else ``()``.
    """
    if languages is None:
        return []
    source, target = languages
    targets = list(target_languages) or [target]
    answer = [{"code": source, "name": language_name(source), "targets": targets}]
    answer += [
        {"code": code, "name": language_name(code), "targets": []}
        for code in targets
        if code != source
    ]
    return answer


def is_libretranslate(fields):
    """Whether the fields are LibreTranslate's request (``q``), not ours."""
    return "q" in fields


def parse_libretranslate(
    fields, limits, encode, languages, target_languages, constrain=None
):
    """The ``TranslateRequest`` of a LibreTranslate request.

    Args:
        fields: the request's fields (``requests.read_fields``).
        limits: ``requests.Limits``.
        encode: ``encode(texts, target_language)`` → each text's ids, as
            for ``requests.parse_translate``.
        languages, target_languages: as for ``languages_answer``.
        constrain: as for ``requests.parse_translate``.
    """
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        names = ", ".join(shown(name) for name in unknown[:5])
        raise RequestError(
            400, f"unknown field(s) [{names}]; LibreTranslate's are {list(FIELDS)}"
        )
    queries, one = _queries(fields["q"])
    target_language = _pair(fields, languages, target_languages)
    html = _format(fields) == "html"
    markup = sum(len(q) for q in queries) if html else 0
    if markup > MAX_MARKUP:
        raise RequestError(
            413, f"{markup} characters of HTML; this server parses at most {MAX_MARKUP}"
        )
    documents = [HtmlDocument.parse(q) for q in queries] if html else None
    texts = [t for d in documents for t in d.texts] if html else queries
    if html and len(texts) > limits.max_texts:
        # Each run is one text to translate: say so in the HTML's own terms.
        raise RequestError(
            413,
            f"the HTML has {len(texts)} text runs (text between tags); this "
            f"server translates at most {limits.max_texts} per request",
        )
    search = search_of({}, limits)
    alternatives = _alternatives(fields, search.beam_size)
    # Markup without text has nothing to search.
    sources = check_texts(texts, "q", limits, encode, target_language) if texts else []
    terms, constraints = glossary_of(fields, texts, "q", constrain)
    check_cost(sources, search, limits, constraints)
    return TranslateRequest(
        texts,
        sources,
        search,
        n=alternatives + 1 if alternatives else None,
        target_language=target_language,
        answer=lambda results, missed=None: _answer(
            results, one, documents, alternatives, missed
        ),
        terms=terms,
        constraints=constraints,
    )


def _queries(q):
    if isinstance(q, str):
        return [q], True
    if isinstance(q, list) and all(isinstance(item, str) for item in q):
        if not q:
            raise RequestError(400, "q is empty: give a text or a list of texts")
        return q, False
    if isinstance(q, list):
        bad = next(i for i, item in enumerate(q) if not isinstance(item, str))
        raise RequestError(400, f"q[{bad}] must be a string, not {json_type(q[bad])}")
    raise RequestError(
        400, f"q must be a string or a list of strings, not {json_type(q)}"
    )


def _pair(fields, languages, target_languages):
    """The target-language token to use (for a model that translates into
    several), once ``source`` and ``target`` are checked."""
    for name in ("source", "target"):
        if name not in fields:
            raise RequestError(400, f"Invalid request: missing {name} parameter")
        if not isinstance(fields[name], str):
            raise RequestError(
                400, f"{name} must be a string, not {json_type(fields[name])}"
            )
    if languages is None:
        raise RequestError(
            400,
            "this model's languages are not known: start kt-serve with "
            "--source-lang and --target-lang",
        )
    source, target = fields["source"], fields["target"]
    targets = list(target_languages) or [languages[1]]
    if source not in (languages[0], "auto") or target not in targets:
        offered = ", ".join(f"{languages[0]} → {code}" for code in targets[:10])
        raise RequestError(
            400,
            f"this server cannot translate {shown(source)} → {shown(target)}; "
            f"it translates {offered}",
        )
    return target if target_languages else None


def _format(fields):
    value = fields.get("format", "text")
    if value not in FORMATS:
        raise RequestError(
            400, f"format must be one of {list(FORMATS)}, not {shown(value)}"
        )
    return value


def _alternatives(fields, beam_size):
    value = fields.get("alternatives", 0)
    text = value.strip() if isinstance(value, str) else ""
    # A form or query field is text. str.isdigit also accepts digits int()
    # refuses ("²"), and int() refuses more than 4,300 digits.
    if text.isascii() and text.isdigit() and len(text) <= 6:
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"alternatives must be an integer, not {shown(value)}")
    most = min(MAX_ALTERNATIVES, beam_size - 1)
    if not 0 <= value <= most:
        raise RequestError(
            400,
            f"alternatives must be in [0, {most}] (the beam of {beam_size} gives "
            f"{beam_size - 1} besides the best). Received: {value}",
        )
    return value


def _answer(results, one, documents, alternatives, missed):
    if alternatives:
        best = [row[0][0] for row in results]
        others = [[text for text, _ in row[1:]] for row in results]
    else:
        best, others = list(results), None
    if documents is not None:
        best, others = _render(documents, best, others)
        if missed is not None:
            missed = _missed_by_document(documents, missed)
    extra = {"alternatives": others, "glossaryMissed": missed}
    if one:
        answer = {"translatedText": best[0]}
        answer.update({k: v[0] for k, v in extra.items() if v is not None})
        return answer
    answer = {"translatedText": best}
    answer.update({k: v for k, v in extra.items() if v is not None})
    return answer


def _missed_by_document(documents, missed):
    """Per document, the terms missed by the translations of its runs
    (each once, in order)."""
    by_document, start = [], 0
    for document in documents:
        end = start + len(document.texts)
        terms = [term for row in missed[start:end] for term in row]
        by_document.append(list(dict.fromkeys(terms)))
        start = end
    return by_document


def _render(documents, best, others):
    """The markup of each document with its runs translated; an alternative
    of a document takes each run's alternative of the same rank."""
    rendered, rendered_others, start = [], [], 0
    for document in documents:
        end = start + len(document.texts)
        rendered.append(document.render(best[start:end]))
        if others is not None:
            ranks = min((len(row) for row in others[start:end]), default=0)
            rendered_others.append(
                [
                    document.render([row[rank] for row in others[start:end]])
                    for rank in range(ranks)
                ]
            )
        start = end
    return rendered, rendered_others if others is not None else None
