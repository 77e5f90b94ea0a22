"""SinusoidalEncoding (paper §3.5) against the paper's formula, in NumPy.

PE(pos, 2i)   = sin(pos / 10000^(2i/d_model))
PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))

Expected values come from `numpy_reference.sinusoidal_pe` (explicit loops,
float64). Runs under every KERAS_BACKEND.
"""

import math

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from tests.layer_checks import MaskProbe, run_layer_test
from tests.numpy_reference import sinusoidal_pe

FLOAT32_EPS = 2.0**-23


def _np(x):
    return np.asarray(ops.convert_to_numpy(x), dtype=np.float64)


def _pe_of_layer(length, d_model, start_index=0, **init_kwargs):
    """The layer's output on zeros, i.e. its positional encoding, (length, d)."""
    layer = kt.SinusoidalEncoding(**init_kwargs)
    out = layer(np.zeros((1, length, d_model), "float32"), start_index=start_index)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    return _np(out)[0]


def _pe_atol(positions):
    """Per-row tolerance for a float32 table.

    The layer computes the angle pos / 10000^(2i/d) in float32; any float32
    implementation rounds that angle, an error of up to about one ulp of the
    angle (<= 2^-23 * pos), which sin/cos pass on unchanged. A 1e-6 tolerance
    therefore holds only for small positions; beyond that the bound grows with
    pos (2.4e-5 at pos 200; the measured error there is ~3e-6). A wrong
    frequency, a swapped sin/cos or an off-by-one position is off by far more.
    """
    positions = np.asarray(positions, dtype=np.float64)
    return (1e-6 + FLOAT32_EPS * positions)[:, None]


def _assert_pe_close(actual, positions, d_model):
    expected = sinusoidal_pe(positions, d_model)
    assert actual.shape == expected.shape
    err = np.abs(actual - expected)
    bad = err > _pe_atol(positions)
    assert not bad.any(), (
        f"max error {err.max():.3g} at (row, dim) {np.argwhere(bad)[:5].tolist()}"
    )


# ---------------------------------------------------------------------------
# The table itself
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("d_model", [16, 7])
def test_encoding_is_the_papers_formula(d_model):
    length = 201  # positions 0..200
    actual = _pe_of_layer(length, d_model)
    _assert_pe_close(actual, range(length), d_model)
    # Strictly 1e-6 where float32 rounding of the angle is that small.
    np.testing.assert_allclose(
        actual[:32], sinusoidal_pe(range(32), d_model), atol=1e-6, rtol=0
    )


def test_sin_on_even_cos_on_odd_dims_interleaved():
    d_model = 16
    positions = np.arange(50, dtype=np.float64)
    actual = _pe_of_layer(50, d_model)
    # i = 0: frequency 1, so PE(pos, 0) = sin(pos) and PE(pos, 1) = cos(pos).
    np.testing.assert_allclose(actual[:, 0], np.sin(positions), atol=1e-6, rtol=0)
    np.testing.assert_allclose(actual[:, 1], np.cos(positions), atol=1e-6, rtol=0)
    # i = 1 sits in dims 2 and 3 (interleaved), not in dims 1 and d/2+1.
    angle = positions / 10000 ** (2 / d_model)
    np.testing.assert_allclose(actual[:, 2], np.sin(angle), atol=1e-6, rtol=0)
    np.testing.assert_allclose(actual[:, 3], np.cos(angle), atol=1e-6, rtol=0)
    # Position 0: sin(0) = 0 on even dims, cos(0) = 1 on odd dims.
    np.testing.assert_allclose(actual[0, 0::2], 0.0, atol=1e-7)
    np.testing.assert_allclose(actual[0, 1::2], 1.0, atol=1e-7)


def test_odd_d_model_ends_with_a_sine():
    actual = _pe_of_layer(20, 7)
    assert actual.shape == (20, 7)
    angle = np.arange(20) / 10000 ** (6 / 7)  # i = 3, 2i = 6
    np.testing.assert_allclose(actual[:, 6], np.sin(angle), atol=1e-6, rtol=0)


def test_base_argument():
    actual = _pe_of_layer(30, 8, base=100.0)
    np.testing.assert_allclose(
        actual, sinusoidal_pe(range(30), 8, base=100.0), atol=5e-6, rtol=0
    )


# ---------------------------------------------------------------------------
# start_index
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("as_tensor", [False, True], ids=["int", "tensor"])
@pytest.mark.parametrize("max_length", [None, 64])
def test_start_index_gives_later_rows(as_tensor, max_length):
    d_model, k, length = 16, 37, 5
    start = ops.convert_to_tensor(k, dtype="int32") if as_tensor else k
    actual = _pe_of_layer(length, d_model, start_index=start, max_length=max_length)
    positions = range(k, k + length)
    _assert_pe_close(actual, positions, d_model)
    # The rows of a full table from 0, not rows 0..T-1 again.
    full = _pe_of_layer(k + length, d_model)
    np.testing.assert_allclose(actual, full[k:], atol=1e-6, rtol=0)
    assert not np.allclose(actual, full[:length], atol=1e-2)


# ---------------------------------------------------------------------------
# Output = input + PE; weights; mask; dtype
# ---------------------------------------------------------------------------
def test_output_is_input_plus_pe(rng):
    d_model, length = 16, 8
    x = rng.standard_normal((3, length, d_model)).astype("float32")
    out = _np(kt.SinusoidalEncoding()(x))
    expected = x.astype(np.float64) + sinusoidal_pe(range(length), d_model)[None]
    np.testing.assert_allclose(out, expected, atol=2e-6, rtol=0)


def test_has_no_weights():
    layer = kt.SinusoidalEncoding(max_length=16)
    layer(np.zeros((2, 4, 8), "float32"))
    assert layer.built
    assert layer.weights == []
    assert layer.trainable_weights == []
    assert layer.non_trainable_weights == []


def test_keras_mask_passes_through():
    ids = np.array([[5, 3, 2, 0, 0], [7, 0, 4, 1, 0]], "int32")
    inputs = keras.Input(shape=(5,), dtype="int32")
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    encoded = kt.SinusoidalEncoding(max_length=16)(embedded)
    model = keras.Model(inputs, MaskProbe()(encoded))
    np.testing.assert_array_equal(_np(model(ids)), (ids != 0).astype("float32"))


def test_too_long_raises():
    layer = kt.SinusoidalEncoding(max_length=8)
    layer(np.zeros((1, 8, 16), "float32"))  # exactly max_length is fine
    with pytest.raises(ValueError, match="max_length"):
        layer(np.zeros((1, 9, 16), "float32"))
    # start_index counts: positions 5..8 do not fit either.
    with pytest.raises(ValueError, match="max_length"):
        layer(np.zeros((1, 4, 16), "float32"), start_index=5)
    with pytest.raises(ValueError, match="max_length"):
        layer(
            np.zeros((1, 4, 16), "float32"),
            start_index=ops.convert_to_tensor(5, dtype="int32"),
        )
    layer(np.zeros((1, 4, 16), "float32"), start_index=4)  # 4..7 fits


def test_max_length_none_accepts_any_length():
    length = 3000
    actual = _pe_of_layer(length, 8, max_length=None)
    assert actual.shape == (length, 8)
    assert np.isfinite(actual).all()
    rows = [0, 1, 999, 2999]
    _assert_pe_close(actual[rows], rows, 8)


@pytest.mark.parametrize("how", ["layer_dtype", "global_policy"])
def test_mixed_float16_output(how, rng):
    d_model, length = 16, 8
    x = rng.standard_normal((2, length, d_model)).astype("float32")
    if how == "layer_dtype":
        layer = kt.SinusoidalEncoding(dtype="mixed_float16")
    else:
        keras.config.set_dtype_policy("mixed_float16")  # reset by conftest
        layer = kt.SinusoidalEncoding()
    out = layer(x)
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    expected = x.astype(np.float64) + sinusoidal_pe(range(length), d_model)[None]
    # float16 has a 2^-11 relative step; |values| < 4.
    np.testing.assert_allclose(_np(out), expected, atol=4e-3, rtol=0)


# ---------------------------------------------------------------------------
# §3.5: "for any fixed offset k, PE(pos+k) can be represented as a linear
# function of PE(pos)": per frequency w_i, the pair (sin, cos) is rotated by
# the angle k * w_i.
# ---------------------------------------------------------------------------
def test_offset_is_a_fixed_rotation():
    d_model, n = 16, 100
    table = _pe_of_layer(n + 50, d_model)
    for k in (1, 3, 10, 50):
        a, b = table[:n], table[k : n + k]
        for i in range(d_model // 2):
            phi = k / 10000 ** (2 * i / d_model)
            c, s = math.cos(phi), math.sin(phi)
            # Row vectors: [sin(t+phi), cos(t+phi)] = [sin t, cos t] @ R.
            rotation = np.array([[c, -s], [s, c]])
            pair = slice(2 * i, 2 * i + 2)
            np.testing.assert_allclose(
                a[:, pair] @ rotation,
                b[:, pair],
                atol=1e-5,
                rtol=0,
                err_msg=f"k={k}, i={i}",
            )
        # The same matrix for every position: fit it on the highest frequency
        # (well conditioned over 100 positions) by least squares.
        fitted, *_ = np.linalg.lstsq(a[:, 0:2], b[:, 0:2], rcond=None)
        c, s = math.cos(k), math.sin(k)
        np.testing.assert_allclose(fitted, [[c, -s], [s, c]], atol=1e-5)
        np.testing.assert_allclose(a[:, 0:2] @ fitted, b[:, 0:2], atol=1e-5)


# ---------------------------------------------------------------------------
# Standard layer checks
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_run_layer_test(tmp_path, rng):
    run_layer_test(
        kt.SinusoidalEncoding,
        init_kwargs={"max_length": 32, "base": 10000.0},
        input_data={"inputs": rng.standard_normal((2, 6, 16)).astype("float32")},
        expected_output_shape=(2, 6, 16),
        expected_num_trainable_weights=0,
        tmp_path=tmp_path,
        # The layer has no weights, so a model made of it has nothing to
        # train: `fit` is meaningless, and on TensorFlow and PyTorch Keras
        # warns "The model does not have any trainable weights" (an error
        # under filterwarnings=error).
        run_training_check=False,
    )
