"""TokenEmbedding: shared, scaled embedding and tied pre-softmax projection (§3.4)."""

import math

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from tests.layer_checks import run_layer_test


def _np(x):
    return ops.convert_to_numpy(x)


def test_embeds_scaled_by_sqrt_d_model():
    layer = kt.TokenEmbedding(vocab_size=11, d_model=16)
    ids = np.array([[3, 10, 0]], "int32")
    out = _np(layer(ids))
    table = _np(layer.embeddings)
    np.testing.assert_allclose(out, table[ids] * math.sqrt(16), rtol=1e-6)
    unscaled = kt.TokenEmbedding(vocab_size=11, d_model=16, scale=False)
    unscaled.build()
    unscaled.embeddings.assign(table)
    np.testing.assert_allclose(_np(unscaled(ids)), table[ids], rtol=1e-6)


def test_default_init_gives_unit_variance_after_scaling():
    layer = kt.TokenEmbedding(vocab_size=4000, d_model=64)
    out = _np(layer(np.arange(4000, dtype="int32")[None]))
    assert abs(out.std() - 1.0) < 0.05


def test_reverse_is_the_tied_projection_in_float32(rng):
    layer = kt.TokenEmbedding(vocab_size=9, d_model=8, dtype="mixed_float16")
    layer.build()
    x = rng.normal(size=(2, 3, 8)).astype("float32")
    logits = layer(x, reverse=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert logits.shape == (2, 3, 9)
    expected = x @ _np(layer.embeddings).T  # no bias, no scaling
    np.testing.assert_allclose(_np(logits), expected, atol=2e-2)  # float16 matmul


def test_mask_marks_padding():
    layer = kt.TokenEmbedding(vocab_size=5, d_model=4)
    ids = np.array([[1, 2, 0, 0]], "int32")
    mask = _np(layer.compute_mask(ops.convert_to_tensor(ids)))
    np.testing.assert_array_equal(mask, ids != 0)


@pytest.mark.parametrize("bad_id", [-1, 7])
def test_out_of_range_ids_raise_in_eager_calls(bad_id):
    layer = kt.TokenEmbedding(vocab_size=7, d_model=4)
    with pytest.raises(ValueError, match=r"Token ids must be in \[0, 7\)"):
        layer(np.array([[1, bad_id]], "int32"))


def test_out_of_range_ids_raise_inside_compiled_functions():
    """JAX's gather returns NaN for a bad index; compiled code must stop too."""
    layer = kt.TokenEmbedding(vocab_size=7, d_model=4)
    good = np.array([[1, 2]], "int32")
    bad = np.array([[1, 7]], "int32")
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        fn = jax.jit(lambda ids: layer(ids))
        assert np.isfinite(np.asarray(fn(good))).all()
        with pytest.raises(Exception, match=r"Token ids must be in \[0, 7\)"):
            np.asarray(fn(bad))
    elif backend == "tensorflow":
        import tensorflow as tf

        fn = tf.function(lambda ids: layer(ids))
        assert np.isfinite(fn(good).numpy()).all()
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"Token ids must"):
            fn(bad)
    else:  # torch runs eagerly: the eager check applies
        with pytest.raises(ValueError, match=r"Token ids must be in \[0, 7\)"):
            layer(ops.convert_to_tensor(bad))


def test_float_ids_are_rejected():
    layer = kt.TokenEmbedding(vocab_size=7, d_model=4)
    with pytest.raises(TypeError, match="integer token ids"):
        layer(np.array([[1.0, 2.5]], "float32"))


def test_rejects_bad_sizes():
    with pytest.raises(ValueError, match="vocab_size=0"):
        kt.TokenEmbedding(vocab_size=0, d_model=4)


@pytest.mark.slow
def test_layer_checks(tmp_path):
    ids = np.array([[1, 2, 3, 0], [4, 5, 0, 0]], "int32")
    run_layer_test(
        kt.TokenEmbedding,
        {"vocab_size": 6, "d_model": 8},
        {"inputs": ids},
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=1,
        tmp_path=tmp_path,
    )
