"""The hashed dropout (keras_transformer/layers/dropout.py) against NumPy and
against what dropout needs: the right rate, the right scale, masks that are
balanced, uncorrelated between elements and new at every call."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from conftest import BACKEND
from keras_transformer.layers import dropout as dropout_lib

RATE = 0.1
# Four standard deviations of a fraction measured over n coin flips.
SIGMAS = 4.0


def _np_mix32(h):
    """The same hash in NumPy's wrapping uint32 arithmetic."""
    h = np.atleast_1d(np.asarray(h, dtype=np.uint32))
    (m1, m2), (s1, s2, s3) = dropout_lib._MULTIPLIERS, dropout_lib._SHIFTS
    h = h ^ (h >> np.uint32(s1))
    h = h * np.uint32(m1)
    h = h ^ (h >> np.uint32(s2))
    h = h * np.uint32(m2)
    return h ^ (h >> np.uint32(s3))


def _np_bits(seed, size):
    seed = np.asarray(seed, dtype=np.uint32).reshape(2, 1)
    key = _np_mix32(seed[0] ^ _np_mix32(seed[1] + np.uint32(dropout_lib._GOLDEN)))
    index = np.arange(size, dtype=np.uint32)
    return _np_mix32(_np_mix32(index ^ key) + key)


def _bits(seed, shape):
    seed = keras.ops.convert_to_tensor(np.asarray(seed, np.uint32))
    return keras.ops.convert_to_numpy(dropout_lib.hashed_bits(seed, shape))


def _tolerance(p, n):
    return SIGMAS * np.sqrt(p * (1 - p) / n)


def test_mix32_is_a_bijection_on_a_sample_with_full_avalanche():
    values = np.arange(1 << 16, dtype=np.uint32) * np.uint32(65537)
    hashed = _np_mix32(values)
    assert len(np.unique(hashed)) == len(values)
    # Flipping one input bit flips the output bits about half the time (a
    # two-round hash is not perfect: 0.51 for the top bit; 1/32 would mean
    # no mixing at all). The dropout bits go through two such hashes.
    for bit in (0, 7, 16, 31):
        flipped = _np_mix32(values ^ np.uint32(1 << bit)) ^ hashed
        per_output_bit = np.unpackbits(flipped.view(np.uint8)).mean()
        assert abs(per_output_bit - 0.5) < 0.03, (bit, per_output_bit)


@pytest.mark.skipif(BACKEND == "torch", reason="refused on torch: the next test")
@pytest.mark.parametrize("seed", [(0, 0), (1234, 7), (2**32 - 1, 2**32 - 1)])
def test_bits_equal_numpy(seed):
    np.testing.assert_array_equal(_bits(seed, (3, 5, 7)).ravel(), _np_bits(seed, 105))


@pytest.mark.skipif(BACKEND != "torch", reason="the torch backend's refusal")
def test_hashed_bits_refused_on_torch():
    with pytest.raises(NotImplementedError, match="uint32"):
        _bits((1, 2), (3,))


def test_numpy_bits_are_uniform_and_uncorrelated():
    n = 1 << 20
    u = _np_bits((42, 3), n) / 2.0**32
    assert abs(u.mean() - 0.5) < SIGMAS * np.sqrt(1 / 12 / n)
    for lag in (1, 2, 256, 1024):
        assert abs(np.corrcoef(u[:-lag], u[lag:])[0, 1]) < SIGMAS / np.sqrt(n), lag
    # The next counter (the next training step) and the next seed (another
    # layer) give streams that do not repeat or follow the first.
    for other in ((42, 4), (43, 3)):
        v = _np_bits(other, n) / 2.0**32
        assert abs(np.corrcoef(u, v)[0, 1]) < SIGMAS / np.sqrt(n), other
        assert (u == v).mean() < 1e-4, other


def test_drop_fraction_and_scale():
    x = np.ones((64, 64, 64), np.float32)
    layer = kt.layers.Dropout(RATE, seed=3)
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    dropped = y == 0
    assert abs(dropped.mean() - RATE) < _tolerance(RATE, x.size)
    np.testing.assert_allclose(y[~dropped], 1 / (1 - RATE), rtol=1e-6)


def test_masks_change_every_call_and_are_independent():
    x = np.ones((128, 1024), np.float32)
    layer = kt.layers.Dropout(0.5, seed=11)
    first = keras.ops.convert_to_numpy(layer(x, training=True)) == 0
    second = keras.ops.convert_to_numpy(layer(x, training=True)) == 0
    # Independent masks at rate 1/2 agree on half the elements.
    agree = (first == second).mean()
    assert abs(agree - 0.5) < _tolerance(0.5, x.size), agree
    other = kt.layers.Dropout(0.5, seed=12)
    third = keras.ops.convert_to_numpy(other(x, training=True)) == 0
    assert abs((first == third).mean() - 0.5) < _tolerance(0.5, x.size)


def test_inference_is_the_identity_and_extreme_rates():
    x = np.random.default_rng(0).normal(size=(4, 8, 16)).astype(np.float32)
    layer = kt.layers.Dropout(RATE)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x)), x)
    none = kt.layers.Dropout(0.0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(none(x, training=True)), x)
    everything = kt.layers.Dropout(1.0)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(everything(x, training=True)), np.zeros_like(x)
    )


def test_same_seed_same_masks():
    x = np.ones((16, 32), np.float32)
    a = kt.layers.Dropout(0.3, seed=5)
    b = kt.layers.Dropout(0.3, seed=5)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(a(x, training=True)),
        keras.ops.convert_to_numpy(b(x, training=True)),
    )


def test_mixed_precision_keeps_the_compute_dtype():
    layer = kt.layers.Dropout(RATE, dtype="mixed_bfloat16")
    y = layer(np.ones((8, 32), np.float32), training=True)
    assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
    values = np.unique(keras.ops.convert_to_numpy(keras.ops.cast(y, "float32")))
    # 1 / 0.9 rounded to bfloat16, and 0.
    expected = float(keras.ops.cast(keras.ops.cast(1 / 0.9, "bfloat16"), "float32"))
    assert set(values) <= {0.0, expected}


def test_config_round_trip_keeps_the_class():
    layer = kt.layers.Dropout(0.2, seed=9, name="d")
    again = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)
    )
    assert type(again) is kt.layers.Dropout
    assert (again.rate, again.seed, again.name) == (0.2, 9, "d")


def test_noise_shape_falls_back_to_keras():
    x = np.ones((4, 16, 8), np.float32)
    layer = kt.layers.Dropout(0.5, noise_shape=(4, 1, 8), seed=1)
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    # One mask per (row, feature), shared along the time axis.
    np.testing.assert_array_equal(y, np.broadcast_to(y[:, :1, :], y.shape))


def test_the_model_uses_it_everywhere():
    model = kt.build_model("tiny", src_vocab_size=50)
    n = kt.transformer_config("tiny").num_layers
    dropouts = [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.Dropout)
    ]
    # Two after the embeddings, 2 per encoder block, 3 per decoder block and
    # one on the weights of each attention layer (1 + 2 per block pair).
    assert len(dropouts) == 2 + 5 * n + 3 * n
    assert all(type(d) is kt.layers.Dropout for d in dropouts)
