"""Glossaries: the matching contract of ``Glossary.targets``, the checks of
its entries, and ``read_glossary_file``'s file and its errors (named by
line)."""

import json
import pickle
import random
import re
import subprocess
import sys
import time
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_transformer.translate.glossary import (
    Glossary,
    GlossaryError,
    read_glossary_file,
)
from tests.installed_commands import HEAVY

pytestmark = pytest.mark.once


def test_imports_without_keras_or_numpy():
    """Glossaries are read before a model loads: no heavy package with them."""
    script = (
        "import json, sys, keras_transformer.translate.glossary\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    output = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(json.loads(output))
    assert not loaded & {*HEAVY, "numpy"}


# -- entries -------------------------------------------------------------------


def test_terms_are_cleaned_and_kept_in_order():
    glossary = Glossary({"  fire \u00a0 engine ": " Feuer  wehr ", "dog": "Hund"})
    assert len(glossary) == 2
    assert list(glossary) == [("fire engine", "Feuer wehr"), ("dog", "Hund")]
    assert glossary.as_dict() == {"fire engine": "Feuer wehr", "dog": "Hund"}
    assert Glossary(glossary.as_dict()).as_dict() == glossary.as_dict()


def test_one_term_in_two_spellings_with_one_target_is_one_entry():
    glossary = Glossary({"Dog": "Hund", "dog": "Hund", "DOG ": "Hund"})
    assert list(glossary) == [("Dog", "Hund")]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"": "Hund"}, "glossary entry '': empty source term"),
        ({" \u3000 ": "Hund"}, "empty source term"),
        ({"dog": "  "}, "glossary entry 'dog': empty target term"),
        ({"hot\tdog": "x"}, "source term 'hot\\tdog' holds '\\t'"),
        ({"dog": "Hu\nnd"}, "target term 'Hu\\nnd' holds '\\n'"),
        ({"dog": "Hu\rnd"}, "holds '\\r'"),
        ({1: "eins"}, "glossary entry 1: source term must be str, got int"),
        ({"dog": None}, "glossary entry 'dog': target term must be str, got NoneType"),
        (
            {"Dog": "Hund", "dog ": "Köter"},
            "glossary entry 'dog ': 'dog' is the same term as 'Dog' in the "
            "glossary, whose target is 'Hund', not 'Köter'",
        ),
        (
            {"fire engine": "a", "FIRE  ENGINE": "b"},
            "'FIRE ENGINE' is the same term as 'fire engine'",
        ),
        ({"Straße": "a", "STRASSE": "b"}, "the same term as 'Straße'"),
    ],
)
def test_bad_entries_are_named(entries, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Glossary(entries)


def test_of():
    glossary = Glossary({"dog": "Hund"})
    assert Glossary.of(glossary) is glossary
    assert Glossary.of(None) is None
    assert Glossary.of({"dog": "Hund"}).as_dict() == {"dog": "Hund"}
    with pytest.raises(TypeError, match=r"got list$"):
        Glossary.of([("dog", "Hund")])
    with pytest.raises(TypeError, match=r"got str \(a file: read it with read_glo"):
        Glossary.of("glossary.tsv")
    with pytest.raises(TypeError, match="from a mapping"):
        Glossary([("dog", "Hund")])


def test_targets_takes_a_str():
    with pytest.raises(TypeError, match="text must be str, got bytes"):
        Glossary({"dog": "Hund"}).targets(b"dog")
    assert Glossary({}).targets("dog") == []


# -- matching ------------------------------------------------------------------


def targets(entries, text):
    return Glossary(entries).targets(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("the dog barks", ["Hund"]),
        ("dog", ["Hund"]),
        ("(dog)", ["Hund"]),
        ("dog's bowl", ["Hund"]),
        ("dogs bark", []),
        ("a hotdog", []),
        ("dog_food", []),  # "_" is a word character
        ("dog2", []),
        ("hot-dog", ["Hund"]),  # "-" is not
    ],
)
def test_word_boundaries(text, expected):
    assert targets({"dog": "Hund"}, text) == expected


def test_terms_ending_in_punctuation_need_no_boundary_there():
    entries = {"C++": "C++", "e.g.": "z. B.", ".NET": ".NET"}
    assert targets(entries, "C++, e.g. ASP.NET") == ["C++", "z. B.", ".NET"]
    assert targets(entries, "C++x") == ["C++"]
    assert targets(entries, "xC++") == []  # "C" starts with a word character
    assert targets(entries, "e.g.:") == ["z. B."]


def test_case_is_folded():
    entries = {"Straße": "street", "Æble": "apple", "dog": "Hund"}
    assert targets(entries, "STRASSE") == ["street"]
    assert targets(entries, "die straße") == ["street"]
    assert targets(entries, "ÆBLE, æble") == ["apple"]
    assert targets(entries, "DOG") == ["Hund"]
    assert targets(entries, "straßen") == []  # no inflection


def test_non_ascii_words_have_boundaries_too():
    entries = {"æble": "apple", "straße": "street"}
    assert targets(entries, "æblet") == []
    assert targets(entries, "hauptstraße") == []
    assert targets(entries, "Hauptstraße, Straße") == ["street"]


def test_whitespace_in_a_term_matches_any_run():
    entries = {"fire engine": "Feuerwehrauto"}
    for text in ("fire engine", "fire   engine", "fire\tengine", "fire\n engine"):
        assert targets(entries, text) == ["Feuerwehrauto"]
    assert targets(entries, "fireengine") == []
    assert targets(entries, "fire-engine") == []


def test_longest_first_then_leftmost():
    entries = {"fire": "Feuer", "fire engine": "Feuerwehrauto", "engine": "Motor"}
    assert targets(entries, "the fire engine") == ["Feuerwehrauto"]
    assert targets(entries, "fire engine, fire") == ["Feuerwehrauto", "Feuer"]
    # A longer match that starts later wins over a shorter one before it,
    # and what it leaves free still counts.
    entries = {"a": "A", "a b": "AB", "b c d": "BCD"}
    assert targets(entries, "a b c d") == ["A", "BCD"]
    # Equally long: the leftmost.
    assert targets({"a b": "AB", "b c": "BC"}, "a b c") == ["AB"]


def test_each_entry_once_in_order_of_first_occurrence():
    entries = {"dog": "Hund", "cat": "Katze", "bird": "Vogel"}
    text = "a cat, a dog, a cat, a DOG and no bird"
    assert targets(entries, text) == ["Katze", "Hund", "Vogel"]
    # Two entries with one target: one each.
    assert targets({"dog": "Hund", "hound": "Hund"}, "dog hound") == ["Hund", "Hund"]


def test_ten_thousand_entries_stay_fast():
    """One regex, not one scan per entry: ten 1,000-character texts of short
    words (a start to try every few characters) in well under a second."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyzäöü"

    def word():
        return "".join(rng.choice(letters) for _ in range(rng.randint(2, 7)))

    entries = {}
    while len(entries) < 10_000:
        term = " ".join(word() for _ in range(rng.randint(1, 3)))
        entries[term] = term.upper()
    start = time.perf_counter()
    glossary = Glossary(entries)
    built = time.perf_counter() - start
    terms = list(entries)
    texts = []
    for _ in range(10):
        words = [rng.choice(terms) for _ in range(60)] + [word() for _ in range(240)]
        rng.shuffle(words)
        texts.append(" ".join(words)[:1000])
    start = time.perf_counter()
    found = [glossary.targets(text) for text in texts]
    searched = time.perf_counter() - start
    assert all(found)
    assert built < 10.0, f"10,000 entries took {built:.2f} s to build"
    assert searched < 1.0, f"ten texts took {searched:.2f} s"


# -- the contract, for random glossaries and texts -----------------------------

# Few words, some inside others and some equal when casefolded; most words
# drawn are "a" or "b" and most terms are pieces of the text, so that terms
# occur, nest and overlap in part ("a b" and "b a a" in "a b a a").
WORDS = ["dog", "Dog", "dogs", "hotdog", "fire", "engine", "Straße", "STRASSE"]
WORDS += ["æble", "c++"]
# (Hypothesis draws the first of one_of's branches most often.)
WORD = st.one_of(st.sampled_from(["a", "b", "B"]), st.sampled_from(WORDS))
SEPARATOR = st.one_of(
    st.just(" "), st.sampled_from(["  ", "\t", "\n", ", ", "-", " (", ") "])
)


def _is_word(character):
    # Python's \w for str patterns, written out independently of re.
    return character.isalnum() or character == "_"


def _normalised(text):
    return " ".join(text.casefold().split())


def _occurrences(key, text):
    """Where ``key`` starts in ``text`` on word boundaries, by brute force."""
    found, start = [], text.find(key)
    while start != -1:
        end = start + len(key)
        before = start == 0 or not (_is_word(text[start - 1]) and _is_word(key[0]))
        after = end == len(text) or not (_is_word(text[end]) and _is_word(key[-1]))
        if before and after:
            found.append(start)
        start = text.find(key, start + 1)
    return found


def _reference(glossary, text):
    """The contract, slowly: every occurrence of every entry, kept longest
    first then leftmost unless it overlaps one kept already."""
    text = _normalised(text)
    keys = {_normalised(source): target for source, target in glossary}
    matches = [(start, key) for key in keys for start in _occurrences(key, text)]
    matches.sort(key=lambda match: (-len(match[1]), match[0]))
    taken, first = set(), {}
    for start, key in matches:
        span = set(range(start, start + len(key)))
        if not span & taken:
            taken |= span
            first[key] = min(first.get(key, start), start)
    return [keys[key] for key in sorted(first, key=first.get)]


@st.composite
def glossaries_and_texts(draw):
    words = draw(st.lists(WORD, min_size=1, max_size=16))
    separators = draw(st.lists(SEPARATOR, min_size=len(words), max_size=len(words)))
    pairs = zip(words, separators, strict=True)
    text = "".join(word + separator for word, separator in pairs)
    terms = draw(st.lists(st.lists(WORD, min_size=1, max_size=3), max_size=3))
    for _ in range(draw(st.integers(1, 8))):
        start = draw(st.integers(0, len(words) - 1))
        size = draw(st.integers(1, 4))
        terms.append(words[start : start + size])
    entries = {}
    for term in terms:  # one target per term however it is spelled
        term = " ".join(draw(st.sampled_from([w, w.upper()])) for w in term)
        entries.setdefault(term, f"<{_normalised(term)}>")
    return Glossary(entries), text


PROPERTY = settings(max_examples=300, deadline=None, derandomize=True)


@PROPERTY
@given(glossaries_and_texts())
def test_every_target_returned_has_its_term_in_the_text(case):
    glossary, text = case
    sources = {target: source for source, target in glossary}
    found = glossary.targets(text)
    assert len(found) == len(set(found))  # each entry once
    for target in found:
        assert _occurrences(_normalised(sources[target]), _normalised(text))


@PROPERTY
@given(glossaries_and_texts())
def test_every_isolated_term_that_no_longer_term_overlaps_is_returned(case):
    glossary, text = case
    found = glossary.targets(text)
    text = _normalised(text)
    spans = [
        (start, start + len(key), key)
        for key in (_normalised(source) for source, _ in glossary)
        for start in _occurrences(key, text)
    ]
    for source, target in glossary:
        key = _normalised(source)
        for start in _occurrences(key, text):
            end = start + len(key)
            isolated = f" {text} "[start : end + 2] == f" {key} "
            rivals = [
                other
                for (first, last, other) in spans
                if other != key and first < end and start < last
                if len(other) >= len(key)
            ]
            if isolated and not rivals:
                assert target in found, (source, text)


@PROPERTY
@given(glossaries_and_texts())
def test_targets_follow_the_contract_exactly(case):
    glossary, text = case
    assert glossary.targets(text) == _reference(glossary, text)


def test_targets_follow_the_contract_on_two_words():
    """Texts of "a" and "b" only, where nearly every term overlaps another:
    thousands of cases, a net under the drawn ones."""
    rng = random.Random(0)
    terms = [" ".join(words) for n in (1, 2, 3, 4) for words in product("ab", repeat=n)]
    for _ in range(3000):
        chosen = rng.sample(terms, rng.randint(1, 6))
        glossary = Glossary({term: term.upper() for term in chosen})
        text = " ".join(rng.choice("ab") for _ in range(rng.randint(1, 10)))
        assert glossary.targets(text) == _reference(glossary, text), (chosen, text)


# -- files ---------------------------------------------------------------------


def write(tmp_path, data, name="glossary.tsv"):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def test_read_glossary_file(tmp_path):
    path = write(
        tmp_path,
        "# terms for the manual\n"
        "\n"
        "dog\tHund\r\n"
        "   \n"
        "  # indented comment\n"
        " fire  engine \t Feuerwehrauto \n"
        "DOG\tHund\n"  # the same entry again
        "Straße\tstreet",  # no final newline
    )
    glossary = read_glossary_file(path)
    assert glossary.as_dict() == {
        "dog": "Hund",
        "fire engine": "Feuerwehrauto",
        "Straße": "street",
    }
    assert glossary.targets("The FIRE ENGINE hit a dog.") == ["Feuerwehrauto", "Hund"]
    empty = write(tmp_path, "# nothing yet\n", "e.tsv")
    assert len(read_glossary_file(str(empty))) == 0


def test_a_byte_order_mark_is_not_part_of_the_first_term(tmp_path):
    path = write(tmp_path, b"\xef\xbb\xbfdog\tHund\ncat\tKatze\n")
    glossary = read_glossary_file(path)
    assert list(glossary) == [("dog", "Hund"), ("cat", "Katze")]
    assert glossary.targets("dog") == ["Hund"]


@pytest.mark.parametrize(
    ("data", "line", "reason"),
    [
        (b"dog\tHund\nfire engine Feuerwehrauto\n", 2, "found no tab"),
        (b"# c\n\nfire\tFeuer\tBrand\n", 3, '"source<TAB>target", found 2 tabs'),
        (b"dog\t\n", 1, "empty target term"),
        (b"dog\tHund\n  \tHund\n", 2, "empty source term"),
        (
            b"dog\tHund\ncat\tKatze\nDOG\tK\xc3\xb6ter\n",
            3,
            "'DOG' is the same term as 'dog' on line 1, whose target is 'Hund', "
            "not 'Köter'",
        ),
        (
            b"dog\tHund\n\ndog\tK\xc3\xb6ter\n",
            3,
            "'dog' is already on line 1 with target 'Hund', not 'Köter'",
        ),
        (b"dog\tHund\nK\xf6ter\tcur\n", 2, "invalid UTF-8 at byte 1 of the line"),
        (b"hot\rdog\tHund\n", 1, "source term 'hot\\rdog' holds '\\r'"),
    ],
)
def test_file_errors_name_the_file_and_line(tmp_path, data, line, reason):
    path = write(tmp_path, data)
    with pytest.raises(GlossaryError) as raised:
        read_glossary_file(path)
    error = raised.value
    assert str(error).startswith(f"{path}, line {line}: ")
    assert reason in str(error)
    assert (error.path, error.line) == (str(path), line)
    assert isinstance(error, ValueError)
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error)


def test_missing_file_and_directory(tmp_path):
    missing = tmp_path / "absent.tsv"
    with pytest.raises(GlossaryError, match=re.escape(f"{missing}: no such file")):
        read_glossary_file(missing)
    with pytest.raises(GlossaryError, match=re.escape(f"{tmp_path}: is a directory")):
        read_glossary_file(tmp_path)
