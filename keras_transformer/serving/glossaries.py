"""A request's glossary: the ``glossary`` field checked and turned into the
constraints of its texts' translations, and the terms a translation missed.

``{"source term": "target term", ...}`` applies to every text of a request
(``translate.glossary`` says how a source term is found in a text); each
target term found becomes a phrase that text's translation must hold,
spelled by the model's tokenizer (``TranslatorBase.constraint_ids``). The
search leaves one out only where the translation's length limit comes
first, and the answer names those.

The checks run on the parse thread, cheapest first: whether the engine and
the server take glossaries at all, the field's shape and size, its entries
(``Glossary``), then the terms each text uses, their spelling and the
tokens they bring per text. That last bound is what the server's warm-up
compiled the constrained searches for: no glossary compiles anything.
"""

from keras_transformer.serving.requests import RequestError, json_type, shown
from keras_transformer.translate.constraints import missing
from keras_transformer.translate.glossary import Glossary, source_key

# Characters of a library message passed on.
MESSAGE = 300


def constrain(translator, limits, texts, value, name):
    """The ``(terms, constraints)`` of ``TranslateRequest`` for the glossary
    ``value`` (the field's value, not null).

    Args:
        translator: the server's engine.
        limits: ``requests.Limits``.
        texts: the request's texts (without a target-language token).
        value: the field's value, as sent.
        name: the texts' field (``texts``, ``q``, ``text``), for messages.

    Raises:
        RequestError: 400 for an engine or a server that takes no
            glossary, a malformed one (naming the entry) or a target term
            the model cannot spell; 413 for one over a limit.
    """
    if not translator.takes_constraints:
        raise RequestError(
            400,
            f"glossary: this server's engine ({translator.engine}) cannot follow "
            "a glossary; serve the .keras translator to use one",
        )
    if not limits.glossary_max_tokens:
        raise RequestError(
            400,
            "glossary: this server takes none (start it with "
            "--glossary-max-tokens N, e.g. 16)",
        )
    glossary = read_glossary_field(value, limits)
    # Cleaned, distinct and in order: constraint_ids keeps them so, row by
    # row, and a missed phrase's index is its term's.
    terms = [list(dict.fromkeys(glossary.targets(text))) for text in texts]
    if not any(terms):
        return terms, None
    try:
        constraints = translator.constraint_ids(texts, constraints=terms)
    except ValueError as error:  # a term the vocabulary cannot spell
        raise RequestError(400, _unspellable(error, terms)) from None
    check_tokens(constraints, terms, limits, name)
    return terms, constraints


def _unspellable(error, terms):
    """The message for ``constraint_ids``' refusal of a term, quoting its
    prefix only (the library's quotes it whole)."""
    message = str(error)
    used = sorted({term for row in terms for term in row})
    bad = next((term for term in used if repr(term) in message), None)
    if bad is None:
        return f"glossary: {message[:MESSAGE]}"
    return (
        f"glossary: the target term {shown(bad)} has characters the model's "
        "vocabulary cannot spell"
    )


def read_glossary_field(value, limits):
    """The ``Glossary`` of a request's ``glossary`` field (its ``value``, as
    sent), or ``RequestError``."""
    if not isinstance(value, dict):
        hint = (
            " (a form or query field is a string: send the request as JSON)"
            if isinstance(value, str)
            else ""
        )
        raise RequestError(
            400,
            'glossary must be an object {"source term": "target term", ...}, '
            f"not {json_type(value)}{hint}",
        )
    most = limits.glossary_max_entries
    if len(value) > most:
        raise RequestError(
            413,
            f"glossary has {len(value)} entries; this server takes at most "
            f"{most} (--glossary-max-entries)",
        )
    # Glossary checks the entries too, but its messages quote terms whole.
    seen = {}  # a source term's key -> (the first spelling, its target)
    for source, target in value.items():
        where = f"glossary[{shown(source)}]"
        _check_entry(where, source, target, limits)
        # The term as Glossary keys it.
        key, cleaned = source_key(source), " ".join(target.split())
        first, known = seen.setdefault(key, (source, cleaned))
        if known != cleaned:
            raise RequestError(
                400,
                f"{where}: the same source term as glossary[{shown(first)}] "
                "(case and spaces aside), with another target",
            )
    try:
        return Glossary(value)
    except ValueError as error:
        raise RequestError(400, str(error)[:MESSAGE]) from None


def _check_entry(where, source, target, limits):
    if not isinstance(target, str):
        raise RequestError(
            400, f"{where} must be a string (the target term), not {json_type(target)}"
        )
    most = limits.glossary_max_term_chars
    for side, term in (("source", source), ("target", target)):
        if len(term) > most:
            raise RequestError(
                413,
                f"{where}: the {side} term is {len(term)} characters long; this "
                f"server takes at most {most} (--glossary-max-term-chars)",
            )
        try:
            term.encode("utf-8")
        except UnicodeEncodeError:
            # JSON may spell a lone surrogate (\ud800), which is no text.
            raise RequestError(
                400, f"{where}: the {side} term is not valid Unicode (a lone surrogate)"
            ) from None
        if any(mark in term for mark in "\t\n\r"):
            raise RequestError(
                400, f"{where}: the {side} term holds a tab or a line break"
            )
        if not term.split():
            raise RequestError(400, f"{where}: the {side} term is empty")


def check_tokens(constraints, terms, limits, name):
    """Refuses a text whose glossary terms bring more target tokens than
    ``glossary_max_tokens``: the widest constrained search compiled."""
    most = limits.glossary_max_tokens
    for i, (row, used) in enumerate(zip(constraints, terms, strict=True)):
        tokens = sum(len(phrase) for phrase in row)
        if tokens > most:
            listed = ", ".join(shown(term) for term in used[:5])
            raise RequestError(
                413,
                f"{name}[{i}] uses glossary terms of {tokens} target tokens "
                f"({listed}); this server takes at most {most} per text "
                "(--glossary-max-tokens)",
            )


def missed_phrases(ids, phrases):
    """The indexes of the ``phrases`` (id lists) that the output ``ids``
    does not hold (the search's, on the search thread)."""
    gone = missing(ids, phrases)
    return [j for j, phrase in enumerate(phrases) if phrase in gone]


def split_missed(request, results):
    """``(answers, missed)`` of a ``TranslateRequest``'s search results:
    ``missed`` is None without a glossary, else per text the target terms
    its translation does not hold. A constrained search's results are
    ``(answer, missed phrase indexes)`` (``Searcher.search``)."""
    if request.terms is None:
        return results, None
    if request.constraints is None:
        return results, [[] for _ in request.terms]
    answers = [answer for answer, _ in results]
    missed = [
        [terms[j] for j in gone]
        for terms, (_, gone) in zip(request.terms, results, strict=True)
    ]
    return answers, missed
