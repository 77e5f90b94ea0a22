"""Tests of the built-in number task (`keras_transformer.data.numbers`).

Backend-independent, but run under every KERAS_BACKEND with the rest of the
suite. Expected spellings are written by hand from English and German
grammar; the parsers below are written from the grammar too, not from the
code under test.
"""

import re

import numpy as np
import pytest

from keras_transformer.data import english, german, make_splits, sample_numbers

# The number task is plain Python: one backend's run covers it.
pytestmark = pytest.mark.once


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Overrides conftest's: nothing here touches Keras, and its per-test
    ``clear_session`` (a full garbage collection) would dominate."""
    yield


# Hand-written: (n, English, German).
EXAMPLES = [
    (0, "zero", "null"),
    (1, "one", "eins"),
    (7, "seven", "sieben"),
    (10, "ten", "zehn"),
    (11, "eleven", "elf"),
    (12, "twelve", "zwölf"),
    (13, "thirteen", "dreizehn"),
    (16, "sixteen", "sechzehn"),
    (17, "seventeen", "siebzehn"),
    (19, "nineteen", "neunzehn"),
    (20, "twenty", "zwanzig"),
    (21, "twenty-one", "einundzwanzig"),
    (30, "thirty", "dreißig"),
    (31, "thirty-one", "einunddreißig"),
    (60, "sixty", "sechzig"),
    (66, "sixty-six", "sechsundsechzig"),
    (70, "seventy", "siebzig"),
    (77, "seventy-seven", "siebenundsiebzig"),
    (99, "ninety-nine", "neunundneunzig"),
    (100, "one hundred", "einhundert"),
    (101, "one hundred one", "einhunderteins"),
    (110, "one hundred ten", "einhundertzehn"),
    (116, "one hundred sixteen", "einhundertsechzehn"),
    (342, "three hundred forty-two", "dreihundertzweiundvierzig"),
    (1000, "one thousand", "eintausend"),
    (1001, "one thousand one", "eintausendeins"),
    (1100, "one thousand one hundred", "eintausendeinhundert"),
    (1234, "one thousand two hundred thirty-four",
     "eintausendzweihundertvierunddreißig"),
    (2017, "two thousand seventeen", "zweitausendsiebzehn"),
    (10000, "ten thousand", "zehntausend"),
    (16016, "sixteen thousand sixteen", "sechzehntausendsechzehn"),
    (21001, "twenty-one thousand one", "einundzwanzigtausendeins"),
    (21005, "twenty-one thousand five", "einundzwanzigtausendfünf"),
    (70070, "seventy thousand seventy", "siebzigtausendsiebzig"),
    (101000, "one hundred one thousand", "einhunderteintausend"),
    (101101, "one hundred one thousand one hundred one",
     "einhunderteintausendeinhunderteins"),
    (200000, "two hundred thousand", "zweihunderttausend"),
    (201001, "two hundred one thousand one", "zweihunderteintausendeins"),
    (
        999999,
        "nine hundred ninety-nine thousand nine hundred ninety-nine",
        "neunhundertneunundneunzigtausendneunhundertneunundneunzig",
    ),
]  # fmt: skip


@pytest.mark.parametrize("n, en, de", EXAMPLES)
def test_hand_written_examples(n, en, de):
    assert english(n) == en
    assert german(n) == de


def test_numpy_integers_are_accepted():
    assert german(np.int64(31)) == "einunddreißig"
    assert english(np.int32(31)) == "thirty-one"


@pytest.mark.parametrize("fn", [english, german])
@pytest.mark.parametrize("n", [-1, -1000, 1_000_000, 10**9])
def test_out_of_range_raises(fn, n):
    with pytest.raises(ValueError, match=f"Received: n={n}"):
        fn(n)


@pytest.mark.parametrize("fn", [english, german])
@pytest.mark.parametrize("n", [1.0, "12", None, True])
def test_non_int_raises(fn, n):
    with pytest.raises(TypeError, match="must be an int"):
        fn(n)


# --- Grammar-based checks on many numbers -----------------------------------

_DE_UNITS = ["ein", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"]
_DE_TEENS = [
    "zehn", "elf", "zwölf", "dreizehn", "vierzehn",
    "fünfzehn", "sechzehn", "siebzehn", "achtzehn", "neunzehn",
]  # fmt: skip
_DE_TENS = [
    "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig",
    "neunzig",
]  # fmt: skip


def _german_regex():
    unit = "(?:" + "|".join(_DE_UNITS) + ")"
    # A lone final 1 is "eins"; inside a word (before tausend) it is "ein".
    unit_final = "(?:eins|" + "|".join(_DE_UNITS[1:]) + ")"
    two = "(?:" + "|".join(_DE_TEENS) + f"|{unit}und(?:" + "|".join(_DE_TENS) + ")"
    two += "|" + "|".join(_DE_TENS) + ")"
    inner = f"(?:{unit}hundert(?:{two}|{unit})?|{two}|{unit})"
    final = f"(?:{unit}hundert(?:{two}|{unit_final})?|{two}|{unit_final})"
    return re.compile(f"null|{inner}tausend(?:{final})?|{final}")


GERMAN = _german_regex()


def _parse_german_below_1000(word):
    """Parse a German numeral below 1000 (without ``tausend``), from the grammar."""
    value = 0
    if "hundert" in word:
        head, word = word.split("hundert")
        value += 100 * (_DE_UNITS.index(head) + 1)
    if not word:
        return value
    if word == "eins":
        return value + 1
    if word in _DE_TEENS:
        return value + 10 + _DE_TEENS.index(word)
    if "und" in word:
        unit, tens = word.split("und")
        return value + (_DE_UNITS.index(unit) + 1) + 10 * (_DE_TENS.index(tens) + 2)
    if word in _DE_TENS:
        return value + 10 * (_DE_TENS.index(word) + 2)
    return value + _DE_UNITS.index(word) + 1


def parse_german(word):
    if word == "null":
        return 0
    if "tausend" in word:
        head, tail = word.split("tausend")
        return 1000 * _parse_german_below_1000(head) + _parse_german_below_1000(tail)
    return _parse_german_below_1000(word)


_EN_SMALL = (
    "zero one two three four five six seven eight nine ten eleven twelve "
    "thirteen fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
_EN_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def parse_english(text):
    """Parse English number words (no "and"), from the grammar."""
    total, group = 0, 0
    for word in text.split(" "):
        if word == "thousand":
            total, group = total + 1000 * group, 0
        elif word == "hundred":
            group *= 100
        elif "-" in word:
            tens, unit = word.split("-")
            group += 10 * (_EN_TENS.index(tens) + 2) + _EN_SMALL.index(unit)
        elif word in _EN_TENS:
            group += 10 * (_EN_TENS.index(word) + 2)
        else:
            group += _EN_SMALL.index(word)
    return total + group


def _many_numbers():
    """All of 0-2100, all multiples of 1000 and 1001, and 20,000 random ones."""
    rng = np.random.default_rng(7)
    return np.unique(
        np.concatenate(
            [
                np.arange(2101),
                np.arange(0, 1_000_000, 1000),
                np.arange(1, 1000) * 1001,
                rng.integers(0, 1_000_000, 20_000),
            ]
        )
    ).tolist()


MANY = _many_numbers()


def test_german_matches_grammar_and_parses_back():
    for n in MANY:
        word = german(n)
        assert GERMAN.fullmatch(word), (n, word)
        assert parse_german(word) == n, (n, word)


def test_german_regex_rejects_wrong_forms():
    # Guards the guard: the regex must reject the classic mistakes.
    for wrong in [
        "ein", "einhundertein", "einstausend", "einsundzwanzig", "dreizig",
        "sechszehn", "siebenzehn", "sechszig", "siebenzig", "zwanzigundeins",
        "hundert", "tausend", "nulltausend", "Eins", "eintausendnull",
    ]:  # fmt: skip
        assert not GERMAN.fullmatch(wrong), wrong


def test_english_parses_back_and_hyphenation():
    hyphenated = re.compile(
        r"(twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)-"
        r"(one|two|three|four|five|six|seven|eight|nine)"
    )
    for n in MANY:
        text = english(n)
        assert parse_english(text) == n, (n, text)
        assert "and" not in text.split(" ") and "  " not in text
        # One hyphenated word per 3-digit group whose last two digits are
        # 21-99 and not a multiple of ten, and no other hyphens.
        groups = [n // 1000, n % 1000] if n >= 1000 else [n]
        expected = sum(20 < g % 100 and g % 10 != 0 for g in groups)
        assert text.count("-") == expected, (n, text)
        for word in text.split(" "):
            if "-" in word:
                assert hyphenated.fullmatch(word), (n, text)


def _expected_word_count(n):
    """Words (hyphenated compounds count as one) from the digits alone."""

    def group(g):  # 1 <= g <= 999
        return 2 * (g >= 100) + (g % 100 != 0)

    if n == 0:
        return 1
    thousands, rest = divmod(n, 1000)
    return (group(thousands) + 1 if thousands else 0) + (group(rest) if rest else 0)


def test_english_word_count():
    for n in MANY:
        assert len(english(n).split(" ")) == _expected_word_count(n), n
    assert max(len(english(n).split(" ")) for n in MANY) == 7  # e.g. 999,999


# --- Splits --------------------------------------------------------------------

SMALL = dict(train_size=3000, val_size=300, test_size=300, uniform_size=200)


def test_default_split_sizes_disjoint_and_core_in_training():
    numbers = sample_numbers(seed=0)
    assert {k: len(v) for k, v in numbers.items()} == {
        "train": 50_000,
        "validation": 1_000,
        "test": 1_000,
        "uniform": 2_000,
    }
    sets = {k: set(v.tolist()) for k, v in numbers.items()}
    # No repeats within a split but 0-101 in training, 21 times each.
    counts = np.bincount(numbers["train"])
    assert counts[:102].tolist() == [21] * 102
    assert counts[102:].max() == 1
    assert sum(map(len, sets.values())) == 54_000 - 20 * 102
    assert not sets["train"] & sets["validation"]
    assert not sets["train"] & sets["test"]
    assert not sets["validation"] & sets["test"]
    for values in numbers.values():
        assert values.min() >= 0 and values.max() <= 999_999
    assert set(range(1000)) <= sets["train"]
    # The uniform split: kept out of training from 1000 on.
    assert not {n for n in sets["uniform"] if n >= 1000} & sets["train"]
    # Evaluation: equal thirds of 4-, 5- and 6-digit numbers (remainder longest).
    for split in ("validation", "test"):
        digits = np.bincount([len(str(n)) for n in numbers[split]], minlength=7)
        assert digits.tolist() == [0, 0, 0, 0, 333, 333, 334]
    # Training beyond 0-999: four-digit numbers run out, the rest are shared.
    digits = np.bincount([len(str(n)) for n in numbers["train"]], minlength=7)
    four_digit_uniform = len(
        {n for n in sets["uniform"] if 1000 <= n < 10_000}
        - sets["validation"]
        - sets["test"]
    )
    assert digits[4] == 9000 - 666 - four_digit_uniform
    beyond = 49_000 - 20 * 102  # the rounds of 0-101 take their place
    assert digits[5] == (beyond - digits[4]) // 2  # the smaller stratum first
    assert digits[6] == beyond - digits[4] - digits[5]


@pytest.mark.parametrize(
    "train_size, rounds",
    [(50_000, 20), (1000 + 2 * 102 * 3 + 203, 3), (1203, 0)],
)
def test_short_numbers_repeat_in_at_most_half_the_room(train_size, rounds):
    numbers = sample_numbers(
        seed=1, train_size=train_size, val_size=10, test_size=10, uniform_size=0
    )
    train = numbers["train"]
    assert len(train) == train_size
    counts = np.bincount(train)
    assert (counts[:102] == rounds + 1).all()
    assert (counts[102:1000] == 1).all() and (counts[1000:] <= 1).all()
    assert len(set(train.tolist())) == train_size - rounds * 102
    # Evaluation is drawn before training: the rounds do not move it.
    without = sample_numbers(
        seed=1,
        train_size=train_size,
        val_size=10,
        test_size=10,
        uniform_size=0,
        short_repeats=0,
    )
    for split in ("validation", "test"):
        np.testing.assert_array_equal(numbers[split], without[split])
    assert len(set(without["train"].tolist())) == train_size  # no repeats at all


def test_make_splits_pairs_and_determinism():
    splits = make_splits(seed=3, **SMALL)
    again = make_splits(seed=3, **SMALL)
    other = make_splits(seed=4, **SMALL)
    assert splits == again
    assert splits["test"] != other["test"]
    numbers = sample_numbers(seed=3, **SMALL)
    for name, (src, tgt) in splits.items():
        assert isinstance(src, list) and isinstance(tgt, list)
        assert (
            len(src)
            == len(tgt)
            == SMALL[{"validation": "val_size"}.get(name, f"{name}_size")]
        )
        # Pairs agree with each other and with the drawn numbers.
        assert [parse_english(s) for s in src] == numbers[name].tolist()
        assert [parse_german(t) for t in tgt] == numbers[name].tolist()
    sources = [set(src) for src, _ in splits.values()]
    assert not (
        sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2]
    )
    # Only the uniform split's numbers below 1000 (the core) are trained on.
    assert all(parse_english(s) < 1000 for s in sources[3] & sources[0])


def test_test_split_does_not_depend_on_other_sizes():
    a = sample_numbers(seed=5, train_size=2000, val_size=100, test_size=200)
    b = sample_numbers(seed=5, train_size=5000, val_size=700, test_size=200)
    np.testing.assert_array_equal(np.sort(a["test"]), np.sort(b["test"]))


def test_small_training_set_takes_part_of_the_core():
    numbers = sample_numbers(seed=0, train_size=500, val_size=10, test_size=10)
    assert len(numbers["train"]) == 500
    assert numbers["train"].max() < 1000
    assert len(set(numbers["train"].tolist())) == 500


def test_make_splits_spells_each_number_once(monkeypatch):
    """The work of ``make_splits`` is one English and one German spelling per
    distinct number drawn (under 54,000 by default). Counted rather than
    timed: the suite asserts no timings."""
    from keras_transformer.data import numbers as module

    calls = {"english": 0, "german": 0}

    def counting(name, spell):
        def wrapper(n):
            calls[name] += 1
            return spell(n)

        return wrapper

    monkeypatch.setattr(module, "english", counting("english", module.english))
    monkeypatch.setattr(module, "german", counting("german", module.german))
    splits = module.make_splits(seed=1)
    assert sum(len(sources) for sources, _ in splits.values()) == 54_000
    distinct = set().union(*(v.tolist() for v in sample_numbers(seed=1).values()))
    assert len(distinct) < 54_000 - 20 * 102  # repeats, and splits that overlap
    assert calls == {"english": len(distinct), "german": len(distinct)}


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(train_size=-1), ValueError),
        (dict(val_size=1.5), TypeError),
        (dict(train_size=900_000, val_size=60_000, test_size=60_000), ValueError),
        (dict(train_size=0, val_size=500_000, test_size=500_000), ValueError),
        (dict(uniform_size=-1), ValueError),
        (dict(uniform_size=True), TypeError),
        (dict(uniform_size=1_000_001), ValueError),
        (dict(short_repeats=-1), ValueError),
        (dict(short_repeats=2.0), TypeError),
        (dict(short_repeats=True), TypeError),
    ],
)
def test_bad_sizes_raise(kwargs, error):
    with pytest.raises(error):
        sample_numbers(**kwargs)


@pytest.mark.slow
def test_largest_possible_splits_cover_the_range():
    numbers = sample_numbers(
        seed=0,
        train_size=998_000,
        val_size=1000,
        test_size=1000,
        uniform_size=0,
        short_repeats=0,
    )
    together = np.concatenate(list(numbers.values()))
    np.testing.assert_array_equal(np.sort(together), np.arange(1_000_000))
    # With a uniform split besides, training has that much less room.
    with pytest.raises(ValueError, match="uniformly drawn"):
        sample_numbers(
            seed=0, train_size=998_000, val_size=1000, test_size=1000, short_repeats=0
        )


def test_uniform_split_is_uniform_and_leaves_the_others_alone():
    numbers = sample_numbers(seed=2, **SMALL)
    without = sample_numbers(seed=2, **{**SMALL, "uniform_size": 0})
    assert len(without["uniform"]) == 0
    for split in ("validation", "test"):
        np.testing.assert_array_equal(numbers[split], without[split])
    uniform = sample_numbers(seed=2, train_size=10, val_size=1, test_size=1)["uniform"]
    assert len(set(uniform.tolist())) == 2000
    assert uniform.min() >= 0 and uniform.max() <= 999_999
    # Drawn uniformly: nine in ten have six digits (2,000 draws: 0.9 +- 0.02
    # at three standard deviations).
    assert 0.88 < np.mean(uniform >= 100_000) < 0.92
    np.testing.assert_array_equal(
        uniform,
        sample_numbers(seed=2, train_size=10, val_size=1, test_size=1)["uniform"],
    )
    assert not np.array_equal(
        uniform,
        sample_numbers(seed=3, train_size=10, val_size=1, test_size=1)["uniform"],
    )


def test_edge_numbers():
    from keras_transformer.data import EDGE_NUMBERS

    assert EDGE_NUMBERS == (0, 1, 17, 21, 101, 1_001, 100_000, 999_999)
    assert [german(n) for n in EDGE_NUMBERS[:4]] == [
        "null", "eins", "siebzehn", "einundzwanzig",
    ]  # fmt: skip
