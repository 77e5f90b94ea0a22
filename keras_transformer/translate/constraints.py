"""Terminology as search constraints: a glossary's target terms, or target
phrases given directly, turned into the token-id phrases a constrained
search must put in each translation (``keras_transformer.search.constrained``),
and the check, after the search, of which ones a translation holds.

A phrase is spelled by the target tokenizer on its own
(``tokenizer.encode_targets``), which for SentencePiece is how it is spelled
after a space inside a sentence: "Hund" is ``▁Hund`` either way. Where that
spelling starts with the word-start piece on its own (``▁``, then ``Hund``),
the lone piece is left out: the term may then also close a compound (German
"zweiund|dreissig"), which a term spelled as a word of its own could never
do; a term whose first piece carries the word start keeps it. A phrase
counts as held when its ids occur in the translation's ids, contiguous, so
a term the model goes on to inflect with a further piece ("▁Hund" "e")
counts as held. This module imports neither Keras nor a backend.
"""

import warnings

from keras_transformer.translate.glossary import Glossary

# SentencePiece's mark of a word's start, a piece of its own before a word
# the vocabulary has no word-initial piece for.
WORD_START = "\u2581"


def constraint_ids(tokenizer, texts, glossary=None, constraints=None):
    """Per text, the id phrases its translation must hold, or None when
    neither ``glossary`` nor ``constraints`` asks for any.

    Args:
        tokenizer: the translator's ``TextTokenizer``.
        texts: the source texts (as the caller gave them: a target-language
            token is not yet added).
        glossary: a dict or ``Glossary`` of ``{source term: target term}``.
        constraints: a list, one per text, of lists of target phrases.

    Raises:
        TypeError, ValueError: a malformed glossary or list of constraints,
            or a phrase the tokenizer cannot spell (it would put the unknown
            id in the translation).
    """
    glossary = Glossary.of(glossary)
    if glossary is None and constraints is None:
        return None
    texts = list(texts)
    phrases = [[] for _ in texts]
    if constraints is not None:
        given = _checked(constraints, len(texts))
        for row, wanted in zip(phrases, given, strict=True):
            row.extend(wanted)
    if glossary is not None:
        for row, text in zip(phrases, texts, strict=True):
            row.extend(term for term in glossary.targets(text) if term not in row)
    spelled = _spell(tokenizer, sorted({p for row in phrases for p in row}))
    rows = [[spelled[p] for p in row] for row in phrases]
    return rows if any(rows) else None


def _checked(constraints, count):
    if isinstance(constraints, (str, bytes)):
        raise TypeError("constraints must be a list (one per text) of lists of str.")
    constraints = list(constraints)
    if len(constraints) != count:
        raise ValueError(
            f"constraints must have one list per text: {count} texts, "
            f"{len(constraints)} lists."
        )
    rows = []
    for i, row in enumerate(constraints):
        if isinstance(row, (str, bytes)) or row is None:
            raise TypeError(
                f"constraints[{i}] must be a list of str. Received: {row!r}"
            )
        row = list(row)
        for phrase in row:
            if not isinstance(phrase, str) or not phrase.strip():
                raise ValueError(
                    f"constraints[{i}] must hold non-empty str. Received: {phrase!r}"
                )
        rows.append(list(dict.fromkeys(p.strip() for p in row)))
    return rows


def _spell(tokenizer, phrases):
    """``{phrase: ids}``, or ``ValueError`` for one the tokenizer cannot spell."""
    ids = tokenizer.encode_targets(phrases) if phrases else []
    spelled = {}
    for phrase, row in zip(phrases, ids, strict=True):
        row = [int(i) for i in row]
        if len(row) > 1 and tokenizer.id_to_token(row[0]) == WORD_START:
            row = row[1:]
        if not row or tokenizer.unk_id in row:
            raise ValueError(
                f"The target term {phrase!r} has characters the model's "
                "vocabulary cannot spell; a translation could not hold it."
            )
        spelled[phrase] = row
    return spelled


def holds(ids, phrase):
    """True where ``phrase`` (ids) occurs in ``ids``, contiguous."""
    n = len(phrase)
    return any(ids[i : i + n] == phrase for i in range(len(ids) - n + 1))


def missing(ids, phrases):
    """The phrases of ``phrases`` (lists of ids) that ``ids`` does not hold."""
    ids = list(ids)
    return [phrase for phrase in phrases if not holds(ids, list(phrase))]


def warn_missing(found, wanted, limits, stacklevel=4):
    """A ``UserWarning`` naming the translations (best hypotheses of
    ``found``) that miss a constraint of ``wanted``: the search reaches a
    row's output limit (``limits``) before meeting them only where they do
    not fit. Returns the indexes of those translations."""
    short = [
        i
        for i, (row, phrases) in enumerate(zip(found, wanted, strict=True))
        if phrases and missing(row[0][0], phrases)
    ]
    if short:
        i = short[0]
        warnings.warn(
            f"{len(short)} of {len(found)} translations miss a constraint: the "
            f"output limit came first, e.g. text {i} (limit "
            f"{limits[i]} tokens, {sum(len(p) for p in wanted[i])} of them "
            "asked for by its constraints).",
            UserWarning,
            stacklevel=stacklevel,
        )
    return short
