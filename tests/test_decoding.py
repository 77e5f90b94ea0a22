"""keras_transformer.search.decoding: the key/value cache, greedy and beam search.

Searches against hand-written references on a trained model are in
test_translator.py; here: the cache step by step against the full model, and
the cached against the uncached search, on untrained models of several
shapes.
"""

import keras
import numpy as np
import pytest

from keras_transformer import build_model
from keras_transformer.search import decoding
from tests import numpy_reference

VOCAB = 40


def model_and_sources(seed=0, **overrides):
    keras.utils.set_random_seed(seed)
    config = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=32)
    model = build_model("tiny", src_vocab_size=VOCAB, **{**config, **overrides})
    rng = np.random.default_rng(seed)
    src = rng.integers(3, VOCAB, (5, 9)).astype("int32")
    for row, length in zip(src, (9, 4, 7, 1, 6), strict=True):
        row[length - 1] = decoding.END_ID
        row[length:] = 0
    return model, src


def numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"norm_first": True, "share_embeddings": False, "num_heads": 2},
    ],
    ids=["post_ln_shared", "pre_ln_separate"],
)
def test_cached_steps_equal_full_model(overrides):
    """Feed a fixed target one token at a time through the cache; the logits
    of each step must be the full model's logits at that position."""
    if overrides.get("share_embeddings") is False:
        overrides["tgt_vocab_size"] = VOCAB + 5
    model, src = model_and_sources(**overrides)
    rng = np.random.default_rng(1)
    target = rng.integers(3, VOCAB, (5, 8)).astype("int32")
    target[:, 0] = decoding.START_ID
    full = numpy(model({"encoder_inputs": src, "decoder_inputs": target}))
    encoder_outputs, encoder_mask = model.encode(src)
    state, cross = model.initial_cache(encoder_outputs, 12)
    for t in range(target.shape[1]):
        tokens = keras.ops.convert_to_tensor(target[:, t])
        index = keras.ops.convert_to_tensor(t, "int32")
        logits, state = model.decode_step(tokens, index, state, cross, encoder_mask)
        np.testing.assert_allclose(numpy(logits), full[:, t], atol=2e-5, rtol=1e-5)
    # The cache (B, H, T_max, d_k) holds the keys and values of the 8 positions
    # fed, and nothing after them.
    keys = numpy(state[0][0])
    assert keys.shape == (5, model.num_heads, 12, model.d_model // model.num_heads)
    assert np.abs(keys[:, :, :8]).max() > 0 and np.abs(keys[:, :, 8:]).max() == 0


@pytest.mark.slow
def test_cached_search_equals_uncached():
    model, src = model_and_sources(seed=3)
    limits = np.array([10, 3, 10, 0, 7], "int32")
    greedy = [
        decoding.greedy_search(model, src, limits, 16, use_cache=c)
        for c in (True, False)
    ]
    np.testing.assert_array_equal(greedy[0][0], greedy[1][0])
    np.testing.assert_allclose(greedy[0][1], greedy[1][1], rtol=1e-5)
    tokens = greedy[0][0]
    # Each row generates exactly up to its limit or its END token; 0 after.
    for row, limit in zip(tokens, limits, strict=True):
        length = int(np.count_nonzero(row))
        assert np.all(row[:length] > decoding.START_ID) and np.all(row[length:] == 0)
        assert length == limit or (length < limit and row[length - 1] == 2)
    beams = [
        decoding.beam_search(model, src, limits, 3, 0.6, 16, use_cache=c)
        for c in (True, False)
    ]
    np.testing.assert_array_equal(beams[0][0], beams[1][0])
    np.testing.assert_allclose(beams[0][1], beams[1][1], rtol=1e-5)
    # Hypotheses are distinct, best first, and the best is at least as
    # probable (after the length penalty) as the greedy output.
    scores = beams[0][1]
    assert np.all(np.diff(scores[[0, 1, 2, 4]], axis=1) <= 0)
    for i in (0, 1, 2, 4):
        assert len({tuple(h) for h in beams[0][0][i]}) == 3
    lengths = np.count_nonzero(tokens, axis=1)
    greedy_scores = greedy[0][1] / decoding.length_penalty(lengths, 0.6)
    assert np.all(scores[[0, 1, 2, 4], 0] >= greedy_scores[[0, 1, 2, 4]] - 1e-5)


@pytest.mark.slow
def test_cache_grows_in_stages(monkeypatch):
    """A cached search starts with a 16-wide cache and widens it (16, 32,
    40 here); the tokens and scores equal the uncached search's, which has no
    cache to grow, on rows that run past each stage's end."""
    model, src = model_and_sources(seed=10, max_length=48)
    widths = []
    grow = model.grow_cache
    monkeypatch.setattr(
        model,
        "grow_cache",
        lambda cache, width: widths.append(width) or grow(cache, width),
    )
    limits = np.array([40, 17, 33, 0, 5], "int32")
    greedy = [
        decoding.greedy_search(model, src, limits, 40, use_cache=c, end_id=None)
        for c in (True, False)
    ]
    np.testing.assert_array_equal(greedy[0][0], greedy[1][0])
    np.testing.assert_allclose(greedy[0][1], greedy[1][1], rtol=1e-4)
    assert np.count_nonzero(greedy[0][0], axis=1).tolist() == limits.tolist()
    beams = [
        decoding.beam_search(model, src, limits, 2, 0.6, 40, use_cache=c, end_id=None)
        for c in (True, False)
    ]
    np.testing.assert_array_equal(beams[0][0], beams[1][0])
    np.testing.assert_allclose(beams[0][1], beams[1][1], rtol=1e-4)
    assert widths[:2] == [32, 40]  # traced once per search (PyTorch: per stage run)


@pytest.mark.slow
def test_without_end_token_runs_to_the_limit():
    model, src = model_and_sources(seed=4)
    tokens, _ = decoding.greedy_search(model, src, 6, 8, end_id=None)
    assert np.all(tokens[:, :6] > decoding.START_ID) and np.all(tokens[:, 6:] == 0)
    tokens, _, _ = decoding.beam_search(model, src, 6, 2, max_length=8, end_id=None)
    assert np.all(tokens[:, :, :6] > decoding.START_ID)


@pytest.mark.slow
@pytest.mark.skipif(
    keras.backend.backend() == "torch", reason="PyTorch runs the loop eagerly"
)
def test_compiled_once_per_shape(monkeypatch):
    """A second call with other sources of the same shapes reuses the compiled
    loop (JAX and TensorFlow trace the search function once)."""
    model, src = model_and_sources(seed=5)
    traces = []
    original = decoding.greedy_loop

    def counting(*args, **kwargs):
        traces.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(decoding, "greedy_loop", counting)
    decoding.greedy_search(model, src, 5, 8)
    decoding.greedy_search(model, src[::-1].copy(), [4, 5, 3, 2, 1], 8)
    assert len(traces) == 1
    decoding.greedy_search(model, src, 5, 16)  # a new output width
    assert len(traces) == 2


@pytest.mark.slow
def test_compiled_search_reads_the_current_weights():
    """A compiled loop is kept per model; it must decode with the weights the
    model has now (after a checkpoint load, say), not those it was built with."""
    model, src = model_and_sources(seed=8)
    _, before = decoding.greedy_search(model, src, 6, 8)
    weights = [w * 1.5 for w in model.get_weights()]
    model.set_weights(weights)
    _, after = decoding.greedy_search(model, src, 6, 8)
    fresh, _ = model_and_sources(seed=9)
    fresh.set_weights(weights)
    _, expected = decoding.greedy_search(fresh, src, 6, 8)
    np.testing.assert_allclose(after, expected, rtol=1e-5)
    assert not np.allclose(after, before, rtol=1e-3)


@pytest.mark.slow
def test_mixed_precision_cache():
    model, src = model_and_sources(seed=6, dtype="mixed_bfloat16")
    target = np.array([[1, 5, 9, 11]] * 5, "int32")
    full = numpy(model({"encoder_inputs": src, "decoder_inputs": target}))
    encoder_outputs, encoder_mask = model.encode(src)
    state, cross = model.initial_cache(encoder_outputs, 8)
    assert keras.backend.standardize_dtype(state[0][0].dtype) == "bfloat16"
    for t in range(4):
        logits, state = model.decode_step(
            keras.ops.convert_to_tensor(target[:, t]),
            keras.ops.convert_to_tensor(t, "int32"),
            state,
            cross,
            encoder_mask,
        )
        assert keras.backend.standardize_dtype(logits.dtype) == "float32"
        # bfloat16 keeps about 3 significant digits.
        np.testing.assert_allclose(numpy(logits), full[:, t], atol=0.1, rtol=0.05)


def test_bad_arguments():
    model, src = model_and_sources()
    with pytest.raises(ValueError, match="2-D integer array"):
        decoding.greedy_search(model, src.astype("float32"), 4)
    with pytest.raises(ValueError, match=r"max_lengths must be in \[0, max_length=4\]"):
        decoding.greedy_search(model, src, 5, max_length=4)
    with pytest.raises(ValueError, match="beam_size must be >= 1"):
        decoding.beam_search(model, src, 4, beam_size=0)
    with pytest.raises(ValueError, match="length_penalty must be >= 0"):
        decoding.beam_search(model, src, 4, length_penalty=float("nan"))
    with pytest.raises(ValueError, match="Token ids must be in"):
        decoding.greedy_search(model, src + VOCAB, 4)


class TableModel:
    """A stand-in model for testing the search alone, through the methods a
    search calls (``encode``, ``initial_cache``, ``decode_step``).

    The next-token logits are a fixed table indexed by the position and by a
    hash of the row and its whole prefix. The hash is the cache, so the
    search must carry each hypothesis' cache along with its tokens, as it
    does the key/value cache.
    """

    def __init__(self, table):
        self.table = keras.ops.convert_to_tensor(table)  # (T, hashes, V)
        self.hashes = table.shape[1]

    def encode(self, source_ids):
        return source_ids, keras.ops.not_equal(source_ids, 0)

    def initial_cache(self, encoder_outputs, max_length):
        # Each source is [row + 3, END]: the hash starts from the row.
        rows = keras.ops.shape(encoder_outputs)[0]
        start = keras.ops.cast(encoder_outputs[:, 0], "int32") - 3
        return start, keras.ops.zeros((rows,))

    def decode_step(self, tokens, index, state, cross_cache, encoder_mask):
        state = (state * 5 + keras.ops.cast(tokens, "int32")) % self.hashes
        logits = keras.ops.take(
            keras.ops.take(self.table, index, axis=0), state, axis=0
        )
        return logits, state

    @staticmethod
    def log_probs(table, row, tokens):
        state = row
        for token in (decoding.START_ID, *tokens):
            state = (state * 5 + token) % table.shape[1]
        return numpy_reference.log_softmax(table[len(tokens), state])


@pytest.fixture
def table_search():
    """(model, sources, table): searches of the model decode the table."""
    rng = np.random.default_rng(7)
    table = rng.normal(0, 2.0, (8, 13, 7)).astype("float32")
    table[:, :, decoding.END_ID] += np.linspace(-2, 2, 8)[:, None]  # END gets likelier
    sources = np.full((6, 2), decoding.END_ID, "int32")
    sources[:, 0] = np.arange(6) + 3
    return TableModel(table), sources, table


@pytest.mark.slow
def test_search_matches_reference_on_a_table(table_search):
    model, sources, table = table_search
    limits = np.array([8, 4, 8, 2, 6, 8], "int32")
    best = {}
    for alpha in (0.0, 0.6, 2.0):
        tokens, scores, _ = decoding.beam_search(model, sources, limits, 3, alpha, 8)
        for row, limit in enumerate(limits):
            expected = numpy_reference.beam_search(
                lambda t, row=row: TableModel.log_probs(table, row, t), 3, alpha, limit
            )
            got = [list(h[h > 0]) for h in tokens[row]]
            assert got == [ids for ids, _ in expected]
            np.testing.assert_allclose(
                scores[row], [score for _, score in expected], rtol=1e-5
            )
            best[alpha, row] = tuple(got[0])
    # The length penalty changes some results here, so it is tested.
    assert any(best[0.0, r] != best[2.0, r] for r in range(6))
    assert any(len(best[0.0, r]) < limits[r] for r in range(6))  # some end at END
    # top_n: the best top_n hypotheses exactly, the search stopped as soon as
    # nothing could overtake them, so some lower slots are left unfinished
    # (one row at a time: a batch runs until all its rows are done).
    unfinished = {}
    for alpha in (0.0, 0.6):
        for top_n in (1, 2):
            for row, limit in enumerate(limits):
                tokens, scores, _ = decoding.beam_search(
                    model, sources[row : row + 1], limit, 3, alpha, 8, top_n=top_n
                )
                expected = numpy_reference.beam_search(
                    lambda t, row=row: TableModel.log_probs(table, row, t),
                    3,
                    alpha,
                    limit,
                )[:top_n]
                got = [list(h[h > 0]) for h in tokens[0]]
                assert got[:top_n] == [ids for ids, _ in expected]
                np.testing.assert_allclose(
                    scores[0, :top_n], [score for _, score in expected], rtol=1e-5
                )
                unfinished[alpha, top_n, row] = sum(
                    len(h) < limit and h[-1:] != [decoding.END_ID] for h in got
                )
    assert sum(unfinished.values()) > 0
    greedy, _ = decoding.greedy_search(model, sources, limits, 8)
    for row, limit in enumerate(limits):
        ((expected, _),) = numpy_reference.beam_search(
            lambda t, row=row: TableModel.log_probs(table, row, t), 1, 0.6, limit
        )
        assert list(greedy[row][greedy[row] > 0]) == expected


def test_length_penalty():
    # Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6) ** alpha; lp = 1 for |Y| = 1.
    assert decoding.length_penalty(1, 0.6) == 1.0
    assert decoding.length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert decoding.length_penalty(30, 0.0) == 1.0
