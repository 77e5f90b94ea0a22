"""Glossaries: the target terms a translation must use, found in its source.

A glossary maps source-language terms to the target-language terms that
translate them (``{"dog": "Hund", "fire engine": "Feuerwehrauto"}``);
``Glossary.targets(text)`` gives the target terms of the entries whose
source term occurs in a sentence, the phrases a constrained search must put
in its translation. The matching rules are the contract, because a user
writing a glossary must be able to predict which entries a sentence uses:

- case does not count: text and terms are compared after ``str.casefold()``
  (so "STRASSE" matches "Straße");
- whitespace inside a term matches any run of whitespace in the text;
- a match sits on word boundaries: the characters just before and after it
  are not word characters (Python's Unicode ``\\w``), so "dog" matches
  neither "dogs" nor "hotdog"; a term that starts (ends) with a non-word
  character, like "C++" or ".NET", needs no boundary on that side;
- where matches overlap, the longest (in characters, casefolded, a run of
  whitespace counting as one) wins, and between equally long ones the
  leftmost; a match that overlaps a winner is dropped, so with "fire" and
  "fire engine", "the fire engine" uses only "fire engine", and with "a b"
  and "b c d", "a b c d" uses only "b c d";
- no inflection or lemmatisation: "dogs" is an entry of its own; nor
  Unicode normalisation: "é" as one character and as "e" with a combining
  accent are two spellings;
- each entry counts once however often it occurs, and the targets come in
  the order of the entries' first (kept) match in the text.

Terms are cleaned the same way everywhere (outer whitespace stripped, inner
runs collapsed to one space) and hold no tab or line break (a glossary file
could not); two source terms equal after cleaning and casefolding are one
term, refused if their targets differ.

A glossary file (``read_glossary_file``) is UTF-8 text (a byte-order mark
is accepted), one ``source<TAB>target`` per line; blank lines and lines
whose first non-blank character is ``#`` are skipped. Its errors name the
file and the line.

This module imports neither Keras nor numpy: glossaries are read and checked
before a model loads, and by tools that never load one.
"""

import collections.abc
import os
import re

from keras_transformer.data.corpus import CorpusError

# A glossary file's field and line separators, which no term can hold.
_SEPARATORS = ("\t", "\n", "\r")
_WORD = re.compile(r"\w")


class GlossaryError(CorpusError):
    """A glossary file that cannot be read as ``source<TAB>target`` lines.

    Args:
        path: the file at fault.
        line: the 1-based line at fault, or None when no one line is.
        reason: what is wrong, e.g. ``'expected "source<TAB>target", found
            no tab'``.

    The message is ``"{path}, line {line}: {reason}"``, or ``"{path}:
    {reason}"`` without a line.
    """

    AT_LINE = "{path}, line {line}"


def _clean(term, side):
    """``term`` with outer whitespace stripped and inner runs collapsed.

    Raises:
        ValueError: not a str, empty, or holding a tab or line break (which
            a glossary file could not hold either).
    """
    if not isinstance(term, str):
        raise ValueError(f"{side} term must be str, got {type(term).__name__}")
    for character in _SEPARATORS:
        if character in term:
            raise ValueError(f"{side} term {term!r} holds {character!r}")
    cleaned = " ".join(term.split())
    if not cleaned:
        raise ValueError(f"empty {side} term")
    return cleaned


def source_key(source):
    """What two source terms that are the same term share."""
    return " ".join(source.casefold().split())


def _is_word(character):
    return _WORD.match(character) is not None


def _pattern(keys):
    """One regex finding, at each place of a normalised text, the longest key
    that matches there on word boundaries (group 1, inside a lookahead so
    that every start is tried, overlaps included).

    Keys are tried longest first, so the first to match is the longest; keys
    starting with a word character share one look-behind, so that each
    branch starts with its literal and the engine skips it at once.
    """
    by_length = sorted(keys, key=lambda key: (-len(key), key))
    branches = {True: [], False: []}
    for key in by_length:
        end = r"(?!\w)" if _is_word(key[-1]) else ""
        branches[_is_word(key[0])].append(re.escape(key) + end)
    parts = []
    if branches[True]:
        parts.append(r"(?<!\w)(?:" + "|".join(branches[True]) + ")")
    if branches[False]:
        parts.append("(?:" + "|".join(branches[False]) + ")")
    return re.compile("(?=(" + "|".join(parts) + "))")


def _prefixes(keys):
    """For each key, the shorter keys that match wherever it does: its
    prefixes that end on a word boundary inside it.

    The regex gives only the longest match at a place; these are the others
    there, which win when that longest one loses to a longer overlap.
    """
    lengths = {len(key) for key in keys}
    found = {}
    for key in keys:
        found[key] = [
            key[:cut]
            for cut in range(1, len(key))
            if cut in lengths
            and key[:cut] in keys
            and not (_is_word(key[cut - 1]) and _is_word(key[cut]))
        ]
    return found


def _add(entries, source, target, line=None):
    """Check one entry and add it to ``entries`` (key -> ``(source, target,
    line)``); a repeated term with the same target is the same entry.

    Raises:
        ValueError: a bad term, or a term already there with another target.
    """
    source, target = _clean(source, "source"), _clean(target, "target")
    key = source_key(source)
    if key not in entries:
        entries[key] = (source, target, line)
        return
    first, known, first_line = entries[key]
    if known == target:
        return
    where = " in the glossary" if first_line is None else f" on line {first_line}"
    if first == source:
        raise ValueError(
            f"{source!r} is already{where} with target {known!r}, not {target!r}"
        )
    raise ValueError(
        f"{source!r} is the same term as {first!r}{where}, whose target is "
        f"{known!r}, not {target!r}"
    )


class Glossary:
    """Source terms and the target terms a translation must use for them.

    Args:
        entries: a mapping ``{source_term: target_term}`` of str.

    Raises:
        TypeError: ``entries`` is not a mapping.
        ValueError: an entry (named) with a term that is not a str, empty,
            or holding a tab or line break, or whose source term another
            entry has too (after casefolding) with a different target.
    """

    def __init__(self, entries):
        if not isinstance(entries, collections.abc.Mapping):
            raise TypeError(
                "a Glossary is made from a mapping {source: target}, got "
                f"{type(entries).__name__}"
            )
        checked = {}
        for source, target in entries.items():
            try:
                _add(checked, source, target)
            except ValueError as error:
                raise ValueError(f"glossary entry {source!r}: {error}") from None
        # key -> (source, target), in the mapping's order.
        self._entries = {key: entry[:2] for key, entry in checked.items()}
        self._regex = _pattern(checked) if checked else None
        self._prefixes = _prefixes(checked)

    @classmethod
    def of(cls, value):
        """``value`` as a Glossary: a Glossary as it is, a mapping made into
        one, None (no glossary) as None.

        Raises:
            TypeError: anything else (a file's path included: read it with
                ``read_glossary_file``).
        """
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, collections.abc.Mapping):
            return cls(value)
        hint = (
            " (a file: read it with read_glossary_file)"
            if isinstance(value, (str, bytes, os.PathLike))
            else ""
        )
        raise TypeError(
            f"glossary must be a Glossary, a dict or None, got "
            f"{type(value).__name__}{hint}"
        )

    def __len__(self):
        return len(self._entries)

    def __iter__(self):
        """The ``(source, target)`` pairs, in the order they were given."""
        return iter(self._entries.values())

    def __repr__(self):
        return f"Glossary({len(self)} entries)"

    def as_dict(self):
        """``{source: target}`` of the cleaned terms: what ``Glossary``
        takes back, and what JSON can hold."""
        return dict(self._entries.values())

    def targets(self, text):
        """The target terms of the entries whose source term occurs in
        ``text``, by the rules of the module docstring.

        Args:
            text: str, one source sentence.

        Returns:
            list of str: one per entry found, in the order of the entries'
            first match in ``text``.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        if self._regex is None:
            return []
        text = " ".join(text.casefold().split())
        kept = _resolve(self._matches(text), len(text))
        order = {}
        for start, key in sorted(kept):
            order.setdefault(key, start)
        return [self._entries[key][1] for key in order]

    def _matches(self, text):
        """Every match in the normalised ``text``: ``(start, key)``."""
        for found in self._regex.finditer(text):
            start, longest = found.start(), found.group(1)
            yield start, longest
            for key in self._prefixes[longest]:
                yield start, key


def _resolve(matches, size):
    """The matches kept: longest first, then leftmost, each dropped if it
    overlaps one kept before it.

    Args:
        matches: ``(start, key)`` pairs in a text of ``size`` characters.

    Returns:
        list of ``(start, key)``.
    """
    taken = bytearray(size)
    kept = []
    for start, key in sorted(matches, key=lambda match: (-len(match[1]), match[0])):
        end = start + len(key)
        if not any(taken[start:end]):
            taken[start:end] = b"\x01" * len(key)
            kept.append((start, key))
    return kept


def read_glossary_file(path):
    """The glossary in a TSV file, one ``source<TAB>target`` per line.

    Args:
        path: str or path-like.

    Returns:
        Glossary: the entries in the file's order.

    Raises:
        GlossaryError: no such file (or a directory), or a line (named) that
            is not UTF-8, has not exactly one tab, has an empty side, or
            repeats an earlier line's source term with another target.
    """
    path = os.fsdecode(path)
    if os.path.isdir(path):
        raise GlossaryError(path, None, "is a directory, not a glossary file")
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        raise GlossaryError(path, None, "no such file") from None
    except OSError as error:
        raise GlossaryError(path, None, f"cannot open ({error.strerror})") from None
    entries = {}
    lines = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    for number, raw in enumerate(lines, 1):
        try:
            entry = _parse_line(raw)
            if entry is not None:
                _add(entries, *entry, line=number)
        except ValueError as error:
            raise GlossaryError(path, number, str(error)) from None
    return Glossary({source: target for source, target, _ in entries.values()})


def _parse_line(raw):
    """``(source, target)`` of one line of a glossary file (bytes, without
    its ``\\n``), or None for a blank or comment line.

    Raises:
        ValueError: not UTF-8, or not exactly one tab.
    """
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"invalid UTF-8 at byte {error.start} of the line ({error.reason})"
        ) from None
    line = line.removesuffix("\r")  # Windows line ends
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    tabs = line.count("\t")
    if tabs != 1:
        found = "no tab" if tabs == 0 else f"{tabs} tabs"
        raise ValueError(f'expected "source<TAB>target", found {found}')
    source, target = line.split("\t")
    return source, target
