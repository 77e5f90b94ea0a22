"""The built-in task: English number words to German number words, 0-999,999.

Every number ``n = a · 1000 + b`` with ``a, b < 1000`` is spelled as the
spelling of ``a``, the word for thousand, and the spelling of ``b``, in both
languages. The spellings of 0-999 are therefore tabulated once, and larger
numbers are put together from the tables.
"""

import numbers

import numpy as np

LIMIT = 1_000_000  # numbers 0 .. LIMIT - 1

_EN_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve "
    "thirteen fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
_EN_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()

# "ein" stands for 1 inside a word (einundzwanzig, einhundert, eintausend);
# "eins" only ends a number (eins, einhunderteins, eintausendeins).
_DE_ONES = "null ein zwei drei vier fünf sechs sieben acht neun".split()
_DE_TEENS = (
    "zehn elf zwölf dreizehn vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn"
).split()
# Irregular: dreißig (not dreizig), sechzig (not sechszig), siebzig (not
# siebenzig); sechzehn and siebzehn above drop -s and -en the same way.
_DE_TENS = (
    "_ _ zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig"
).split()


def _english_below_1000(n):
    """English words for 1 <= n <= 999, e.g. ``three hundred forty-two``."""
    words = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        words += [_EN_ONES[hundreds], "hundred"]
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        # Compounds 21-99 are hyphenated: forty-two.
        words.append(_EN_TENS[tens] + (f"-{_EN_ONES[ones]}" if ones else ""))
    elif rest:
        words.append(_EN_ONES[rest])
    return " ".join(words)


def _german_below_1000(n, final):
    """German word for 1 <= n <= 999; ``final`` if nothing follows it.

    ``final`` decides between ``eins`` (end of the number) and ``ein``
    (before ``tausend``) when the number ends in a lone 1.
    """
    hundreds, rest = divmod(n, 100)
    word = f"{_DE_ONES[hundreds]}hundert" if hundreds else ""
    if rest == 1:
        word += "eins" if final else "ein"
    elif rest < 10:
        word += _DE_ONES[rest] if rest else ""
    elif rest < 20:
        word += _DE_TEENS[rest - 10]
    else:
        tens, ones = divmod(rest, 10)
        # Units before tens, joined by "und": zweiundvierzig.
        word += (f"{_DE_ONES[ones]}und" if ones else "") + _DE_TENS[tens]
    return word


# Tables for 1..999 (index 0 unused: zero is spelled only on its own).
_EN = [""] + [_english_below_1000(n) for n in range(1, 1000)]
_DE_FINAL = [""] + [_german_below_1000(n, final=True) for n in range(1, 1000)]
_DE_INNER = [""] + [_german_below_1000(n, final=False) for n in range(1, 1000)]


def _check_number(n):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be an int. Received: n={n!r} ({type(n).__name__})")
    if not 0 <= n < LIMIT:
        raise ValueError(f"n must be in [0, {LIMIT - 1:,}]. Received: n={n!r}")
    return int(n)


def english(n):
    """English number words for ``n``: no "and", hyphenated 21-99 compounds.

    Args:
        n: int in ``[0, 999999]``.

    Returns:
        Words separated by single spaces, e.g. 342 -> ``three hundred
        forty-two``, 21005 -> ``twenty-one thousand five``.

    Raises:
        TypeError: ``n`` is not an int.
        ValueError: ``n`` is out of range.
    """
    n = _check_number(n)
    if n == 0:
        return "zero"
    thousands, rest = divmod(n, 1000)
    words = [f"{_EN[thousands]} thousand"] if thousands else []
    if rest:
        words.append(_EN[rest])
    return " ".join(words)


def german(n):
    """The German numeral for ``n`` as one lower-case word.

    Args:
        n: int in ``[0, 999999]``.

    Returns:
        e.g. 342 -> ``dreihundertzweiundvierzig``, 21001 ->
        ``einundzwanzigtausendeins``, 101000 -> ``einhunderteintausend``.

    Raises:
        TypeError: ``n`` is not an int.
        ValueError: ``n`` is out of range.
    """
    n = _check_number(n)
    if n == 0:
        return "null"
    thousands, rest = divmod(n, 1000)
    word = f"{_DE_INNER[thousands]}tausend" if thousands else ""
    return word + _DE_FINAL[rest]


# Strata by number of digits; 0-999 are the "core" (see sample_numbers).
_STRATA = ((1_000, 10_000), (10_000, 100_000), (100_000, LIMIT))

# Numbers any model of the task should get right, reported one by one after
# training: zero, one, a teen, the first compound, "eins" after "hundert" and
# after "tausend", the first and the last six-digit numbers.
EDGE_NUMBERS = (0, 1, 17, 21, 101, 1_001, 100_000, 999_999)

# 0-101 are whole sources that training otherwise shows once per epoch among
# 50,000, too rarely for a short run to learn 0 and 1 (docs/results.md): the
# irregular small numbers, the tens, and "eins" at the end after "hundert".
SHORT_NUMBERS = 102
SHORT_REPEATS = 20

# Words a small subword vocabulary would spell letter by letter: "null" is
# the only German number word with a doubled letter, so a model that never
# saw "l" follow "l" ends it early ("nul"); "zero", like "null", is one
# sentence in each round of 0-101, too rare among 100,000 training sentences
# to become a piece. As user-defined pieces (``train_tokenizer``) each is one
# token.
WHOLE_WORDS = ("zero", "null")


def _equal_shares(total, capacities):
    """Split ``total`` as evenly as the ``capacities`` allow.

    Strata are filled from the smallest capacity up; one that cannot take an
    equal share of what is left passes the rest on to the larger ones, which
    also get any remainder of the division.
    """
    shares = [0] * len(capacities)
    order = sorted(range(len(capacities)), key=lambda i: capacities[i])
    left = total
    for position, i in enumerate(order):
        shares[i] = min(capacities[i], left // (len(order) - position))
        left -= shares[i]
    return shares


def _check_count(label, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{label} must be an int. Received: {value!r}")
    if value < 0:
        raise ValueError(f"{label} must be >= 0. Received: {value!r}")


def _check_sizes(sizes, short_repeats):
    _check_count("short_repeats", short_repeats)
    for name, size in sizes.items():
        _check_count(f"{name} size", size)
    large = LIMIT - 1000
    drawn = sizes["test"] + sizes["validation"]
    if drawn > large or drawn + sizes["train"] > LIMIT:
        raise ValueError(
            f"The splits do not fit in {LIMIT:,} numbers ({large:,} of them "
            f"from 1000 on for validation and test). Received sizes: {sizes}"
        )
    if sizes["uniform"] > LIMIT:
        raise ValueError(
            f"uniform size must be <= {LIMIT:,}. Received: {sizes['uniform']}"
        )


def _without(pools, used, held):
    """``pools`` with the numbers in ``held`` taken out of their unused parts."""
    return [
        np.concatenate([pool[:u], pool[u:][~np.isin(pool[u:], held)]])
        for pool, u in zip(pools, used, strict=True)
    ]


def _core_and_short(rng, size, short_repeats):
    """Training's first numbers, ``size`` of them at most: 0-999 (some of them
    if ``size < 1000``), then the rounds of 0-101; and the size left."""
    core = min(size, 1000)
    parts = [np.sort(rng.permutation(1000)[:core])]
    size -= core
    rounds = min(short_repeats, size // (2 * SHORT_NUMBERS))
    parts.extend([np.arange(SHORT_NUMBERS)] * rounds)
    return parts, size - rounds * SHORT_NUMBERS


def _no_room(sizes, capacity):
    return ValueError(
        f"train size {sizes['train']:,} does not fit: {capacity + 1000:,} "
        f"numbers are left for training besides validation, test "
        f"and the {sizes['uniform']:,} uniformly drawn. Received "
        f"sizes: {sizes}"
    )


def sample_numbers(
    seed=0,
    train_size=50_000,
    val_size=1_000,
    test_size=1_000,
    uniform_size=2_000,
    short_repeats=SHORT_REPEATS,
):
    """Draw integers in ``[0, 999999]`` for the splits, training apart from the rest.

    Design:

    - **Training covers the building blocks.** Every number is spelled from
      the spellings of two numbers below 1000, so training starts with all of
      0-999 (a random subset if ``train_size < 1000``). This puts every word
      and irregular form (elf, zwölf, sechzehn, siebzig, dreißig, eins/ein) in
      the training data.
    - **The shortest numbers more often.** 0-101 come ``short_repeats`` more
      times (in whole rounds, in at most half the room left after 0-999)
      instead of as many numbers >= 1000: else each is once among 50,000.
    - **The rest is stratified by length.** In every split, numbers >= 1000
      come in equal shares from the 4-, 5- and 6-digit numbers, so short
      numbers are not drowned out: drawn uniformly, 90 % would have six
      digits. A stratum that runs out passes its share on to the longer ones
      (there are only 9,000 four-digit numbers: at the default sizes training
      gets all 8,334 left after validation and test).
    - **Evaluation is drawn first.** Test, then validation, then training
      take consecutive slices of one seeded permutation per stratum, so the
      splits are disjoint, and the test set depends only on ``seed`` and
      ``test_size`` (not on the other sizes). Validation and test hold only
      numbers >= 1000; 0-999 are all in training at the default sizes.
    - **A uniform split besides.** ``uniform`` holds numbers drawn uniformly
      from 0-999,999 (nine in ten have six digits), from a generator of its
      own, so the other evaluation splits are the same with or without it.
      Those >= 1000 are kept out of training; the few below 1000 are in
      training, like all of 0-999. It may share numbers with validation and
      test (all three are for evaluation only).

    Args:
        seed: seed of the NumPy generator; same seed, same splits.
        train_size: number of training numbers.
        val_size: number of validation numbers.
        test_size: number of test numbers.
        uniform_size: number of uniformly drawn numbers.
        short_repeats: extra rounds of 0-101 in training (0 for none).

    Returns:
        ``{"train": array, "validation": array, "test": array, "uniform":
        array}`` of int64 numbers, each in a seeded random order. Only
        ``train`` repeats numbers (0-101, if ``short_repeats``).

    Raises:
        TypeError: a size or ``short_repeats`` is not an int.
        ValueError: one of them is negative, or the sizes do not fit the range.
    """
    sizes = {"test": test_size, "validation": val_size, "train": train_size}
    sizes["uniform"] = uniform_size
    _check_sizes(sizes, short_repeats)
    uniform = np.random.default_rng([seed, 1]).choice(
        LIMIT, uniform_size, replace=False
    )
    rng = np.random.default_rng(seed)
    pools = [lo + rng.permutation(hi - lo) for lo, hi in _STRATA]
    used = [0] * len(pools)
    splits = {}
    for name in ("test", "validation", "train"):
        size = sizes[name]
        parts = []
        if name == "train":
            parts, size = _core_and_short(rng, size, short_repeats)
            pools = _without(pools, used, uniform[uniform >= 1000])
        capacities = [len(pool) - u for pool, u in zip(pools, used, strict=True)]
        if name == "train" and size > sum(capacities):
            raise _no_room(sizes, sum(capacities))
        for i, share in enumerate(_equal_shares(size, capacities)):
            parts.append(pools[i][used[i] : used[i] + share])
            used[i] += share
        splits[name] = rng.permutation(np.concatenate(parts).astype(np.int64))
    splits["uniform"] = uniform.astype(np.int64)
    return {name: splits[name] for name in ("train", "validation", "test", "uniform")}


def make_splits(
    seed=0,
    train_size=50_000,
    val_size=1_000,
    test_size=1_000,
    uniform_size=2_000,
    short_repeats=SHORT_REPEATS,
):
    """English → German number-word pairs for training, validation and test.

    The numbers come from ``sample_numbers`` (see there for the design:
    disjoint splits, all of 0-999 in training and 0-101 more often, the rest
    stratified by number of digits).

    Args:
        seed: seed; same seed, same splits.
        train_size: number of training pairs.
        val_size: number of validation pairs.
        test_size: number of test pairs.
        uniform_size: number of pairs of the uniform split.
        short_repeats: extra rounds of 0-101 in training (0 for none).

    Returns:
        ``{"train": (sources, targets), "validation": ..., "test": ...,
        "uniform": ...}``
        where ``sources`` are ``english(n)`` and ``targets`` ``german(n)``,
        lists of str in the same order.
    """
    splits = sample_numbers(
        seed, train_size, val_size, test_size, uniform_size, short_repeats
    )
    spelt = {}
    for values in splits.values():
        for n in values.tolist():
            if n not in spelt:
                spelt[n] = (english(n), german(n))
    return {
        name: (
            [spelt[n][0] for n in values.tolist()],
            [spelt[n][1] for n in values.tolist()],
        )
        for name, values in splits.items()
    }
