"""keras_transformer.search.constrained: lexically constrained beam search.

Every output must hold every constraint that fits, contiguous: checked here
on the output ids by plain Python, not by the search's own bookkeeping. Rows
without constraints must come out as the plain search gives them, cached
and uncached searches must agree, and a new set of constraints of the same
width must not compile a new program.
"""

import warnings
from pathlib import Path

import keras
import numpy as np
import pytest

from keras_transformer import backend
from keras_transformer.search import decoding, shapes
from keras_transformer.search.constrained import constraint_arrays
from keras_transformer.translate.constraints import holds, missing
from tests.test_decoding import VOCAB, model_and_sources

LIMIT, WIDTH = 12, 16


@pytest.fixture(scope="module")
def searched():
    """One model for the module: its compiled searches are shared."""
    return model_and_sources(seed=3)


def random_constraints(seed, rows=5, vocab=VOCAB):
    """Per row, 0 to 2 phrases of 1 to 3 ids (never a special id), at most
    5 tokens in all: they fit in ``LIMIT``."""
    rng = np.random.default_rng(seed)
    constraints = []
    for _ in range(rows):
        phrases = []
        for _ in range(rng.integers(0, 3)):
            phrases.append([int(t) for t in rng.integers(3, vocab, rng.integers(1, 3))])
        constraints.append(phrases)
    return constraints


def best(tokens, row):
    ids = tokens[row, 0].tolist()
    return ids[: ids.index(0)] if 0 in ids else ids


@pytest.mark.parametrize("form", ["gnmt", "transformers"])
def test_every_output_holds_every_constraint(form, searched):
    model, src = searched
    for seed in range(3):
        constraints = random_constraints(seed)
        tokens, scores, _ = decoding.beam_search(
            model, src, LIMIT, 4, 0.6, WIDTH,
            constraints=constraints, length_penalty_form=form,
        )  # fmt: skip
        for row, phrases in enumerate(constraints):
            ids = best(tokens, row)
            assert missing(ids, phrases) == [], (seed, row, ids, phrases)
            assert np.isfinite(scores[row, 0])
            if form == "transformers":
                assert ids[-1] == decoding.END_ID or len(ids) < LIMIT


def test_rows_without_constraints_search_as_without(searched):
    """Rows with no constraint in a constrained batch: the plain search's
    tokens and scores (the same candidates win, ranked the same)."""
    model, src = searched
    plain, plain_scores, _ = decoding.beam_search(model, src, LIMIT, 4, 0.6, WIDTH)
    constraints = [[], [[7, 8]], [], [[5]], []]
    tokens, scores, _ = decoding.beam_search(
        model, src, LIMIT, 4, 0.6, WIDTH, constraints=constraints
    )
    for row in (0, 2, 4):
        np.testing.assert_array_equal(tokens[row, 0], plain[row, 0])
        np.testing.assert_allclose(scores[row, 0], plain_scores[row, 0], rtol=1e-6)
    for row in (1, 3):
        assert holds(best(tokens, row), constraints[row][0])


def test_cached_equals_uncached(searched):
    model, src = searched
    constraints = random_constraints(7)
    cached = decoding.beam_search(
        model, src, LIMIT, 4, 0.6, WIDTH, constraints=constraints
    )
    uncached = decoding.beam_search(
        model, src, LIMIT, 4, 0.6, WIDTH, use_cache=False, constraints=constraints
    )
    np.testing.assert_array_equal(cached[0], uncached[0])
    np.testing.assert_allclose(cached[1], uncached[1], rtol=1e-4, atol=1e-4)


def test_a_phrase_is_met_contiguous_and_a_broken_one_counts_not(searched):
    """The phrase [a, b] with ``a`` forced early: an output that holds ``a``
    and ``b`` apart does not hold the phrase; the search must put them
    together."""
    model, src = searched
    for a, b in [(9, 11), (20, 21), (33, 5)]:
        constraints = [[[a, b, a]]] * 5
        tokens, _, _ = decoding.beam_search(
            model, src, LIMIT, 4, 0.6, WIDTH, constraints=constraints
        )
        for row in range(5):
            assert holds(best(tokens, row), [a, b, a]), best(tokens, row)


def test_a_constraint_longer_than_the_limit_is_left_out_not_hidden(searched):
    model, src = searched
    too_long = [list(range(3, 3 + LIMIT + 1))]
    tokens, scores, _ = decoding.beam_search(
        model, src, LIMIT, 4, 0.6, WIDTH, constraints=[too_long] * 5
    )
    for row in range(5):
        assert missing(best(tokens, row), too_long) == too_long
        assert len(best(tokens, row)) <= LIMIT


@pytest.mark.once
def test_bad_constraints_are_refused(searched):
    model, src = searched
    for bad, error in [
        ([[[]]], ValueError),  # an empty phrase
        ([[[decoding.END_ID]]], ValueError),
        ([[[decoding.PAD_ID, 5]]], ValueError),
        ([[[VOCAB + 1]]], ValueError),
        ([[["five"]]], TypeError),
        ([[]] * 6, ValueError),  # more rows than sources
    ]:
        with pytest.raises(error):
            decoding.beam_search(model, src, LIMIT, 4, 0.6, WIDTH, constraints=bad)


@pytest.mark.once
def test_constraint_arrays():
    tokens, starts, nexts = constraint_arrays([[[5, 6, 7], [8]], [[9, 10]]], 3, 8)
    np.testing.assert_array_equal(tokens[0, :5], [5, 6, 7, 8, -1])
    np.testing.assert_array_equal(starts[0, :4], [0, 0, 0, 3])
    np.testing.assert_array_equal(nexts[0, :4], [1, 2, -1, -1])
    np.testing.assert_array_equal(tokens[1, :3], [9, 10, -1])
    np.testing.assert_array_equal(nexts[1, :2], [1, -1])
    assert (tokens[2] == -1).all()
    assert [shapes.constraint_width(n) for n in (0, 1, 8, 9, 16, 17)] == [
        8, 8, 8, 16, 16, 32,
    ]  # fmt: skip


@pytest.mark.skipif(
    keras.backend.backend() == "torch", reason="PyTorch runs the loop eagerly"
)
def test_new_constraints_of_one_width_compile_nothing(searched):
    model, src = searched
    decoding.beam_search(model, src, LIMIT, 4, 0.6, WIDTH, constraints=[[[5, 6]]])
    before = backend.compilations()
    for constraints in ([[[7]], [[8, 9], [10]]], [[], [], [[11, 12, 13, 14, 15]]]):
        decoding.beam_search(model, src, LIMIT, 4, 0.6, WIDTH, constraints=constraints)
    assert backend.compilations() == before
    # Seventeen tokens: a wider bucket, one new program.
    decoding.beam_search(model, src, LIMIT, 4, 0.6, WIDTH, constraints=[[[5] * 17]])
    assert backend.compilations() == before + 1


# -- the translator: glossaries and phrases, checked on the text ----------------

FIXTURE = Path(__file__).parent / "fixtures" / "v0_3_0" / "translator.keras"


@pytest.fixture(scope="module")
def numbers():
    return keras.saving.load_model(FIXTURE)


def test_a_glossary_is_followed_where_its_term_occurs_and_nowhere_else(numbers):
    """The Swiss spelling "dreissig", which the model never writes: every
    source with the word "thirty" gets it; the others translate as
    without a glossary (their batch has no constraint)."""
    # One batch shape for every call: two programs, plain and constrained.
    rows = dict(batch_size=8, fixed_batch=True)
    with_term = ["thirty", "one hundred thirty", "thirty-two"]
    without = ["seven", "three hundred", "thirteen"]
    plain = numbers.translate(with_term + without, **rows)
    assert not any("dreissig" in text for text in plain)
    glossary = {"thirty": "dreissig"}
    got = numbers.translate(with_term, glossary=glossary, **rows)
    assert all("dreissig" in text for text in got), got
    assert numbers.translate(without, glossary=glossary, **rows) == plain[3:]
    # The same as phrases given directly, and in the n best's first.
    assert numbers.translate(with_term, constraints=[["dreissig"]] * 3, **rows) == got
    best = numbers.n_best(with_term[:1], n=2, glossary=glossary, **rows)
    assert best[0][0][0] == got[0]


@pytest.mark.once
def test_what_cannot_be_followed_is_said(numbers):
    # Recorded rather than pytest.warns: on PyTorch, NumPy's DeprecationWarning
    # about torch's __array__ comes through pytest.warns as an error.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        numbers.translate(["seven"], constraints=[["dreissig"]], max_output_length=4)
    said = [str(w.message) for w in caught if w.category is UserWarning]
    assert any("1 of 1 translations miss a constraint" in m for m in said), said
    with pytest.raises(ValueError, match="cannot spell"):
        numbers.translate(["seven"], glossary={"seven": "SIEBEN"})
    with pytest.raises(ValueError, match="one list per text"):
        numbers.translate(["seven", "six"], constraints=[["sieben"]])
    with pytest.raises(TypeError):
        numbers.translate(["seven"], glossary=[("seven", "sieben")])
