"""Sharded weights: ``model_parallel(K)`` over the 4 virtual CPU devices
of the JAX run (``XLA_FLAGS=--xla_force_host_platform_device_count=4``).

Reference: the same model, same weights, on one device.
"""

import re

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.distribute import parallel as distribute

BACKEND = keras.backend.backend()
SIZES = dict(d_model=16, num_heads=4, d_ff=32, num_layers=1, max_length=16)


def batch(rows=4, length=6):
    rng = np.random.default_rng(0)
    src = rng.integers(4, 20, (rows, length)).astype("int32")
    src[1, 4:] = 0  # padding, so that masks take part
    tgt = rng.integers(4, 20, (rows, length)).astype("int32")
    dec = np.concatenate([np.ones((rows, 1), "int32"), tgt[:, :-1]], axis=1)
    return {"encoder_inputs": src, "decoder_inputs": dec}, tgt


def model():
    return kt.build_model("tiny", src_vocab_size=20, dropout=0.0, **SIZES)


needs_four_devices = pytest.mark.skipif(
    BACKEND != "jax" or len(keras.distribution.list_devices()) < 4,
    reason="keras.distribution.ModelParallel is JAX-only; 4 devices from XLA_FLAGS",
)


@needs_four_devices
@pytest.mark.slow
@pytest.mark.parametrize("model_axis", [2, 4])
def test_sharded_model_gives_the_logits_of_one_device_and_trains(model_axis):
    x, y = batch()
    keras.utils.set_random_seed(0)
    plain = model()
    expected = keras.ops.convert_to_numpy(plain(x))
    with distribute.model_parallel(model_axis) as setup:
        assert setup.num_replicas == 4 // model_axis
        sharded = model()
        sharded.set_weights(plain.get_weights())
        got = keras.ops.convert_to_numpy(sharded(x))
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)

        # Each device holds 1/K of every kernel named in the layout map.
        for weight in sharded.weights:
            shard = weight.value.addressable_shards[0].data.shape
            split = [
                axis
                for pattern, axis in distribute.MODEL_PARALLEL_LAYOUT.items()
                if re.fullmatch(pattern, weight.path)
            ]
            full = tuple(weight.shape)
            if split:
                cut = split[0].index("model")
                want = full[:cut] + (full[cut] // model_axis,) + full[cut + 1 :]
                assert shard == want, weight.path
            else:
                assert shard == full, weight.path
        held = distribute.weight_bytes_per_device(sharded)
        assert len(held) == 4
        share = max(held.values()) / distribute.weight_bytes(sharded)
        # Only layer norms and output biases are whole on every device.
        assert share < 1 / model_axis + 0.1

        sharded.compile(
            optimizer=kt.transformer_optimizer(16, warmup_steps=10),
            loss=kt.LabelSmoothedCrossEntropy(),
        )
        before = [keras.ops.convert_to_numpy(w) for w in sharded.trainable_weights]
        loss = float(sharded.train_on_batch(x, y))
        assert np.isfinite(loss)
        moved = [
            np.abs(keras.ops.convert_to_numpy(w) - b).max()
            for w, b in zip(sharded.trainable_weights, before, strict=True)
        ]
        assert max(moved) > 1e-4
        kernel = sharded.get_layer("encoder_block_0").ffn_inner.kernel
        assert kernel.value.addressable_shards[0].data.shape == (16, 32 // model_axis)
    # Put back: a new model is whole on one device.
    assert keras.distribution.distribution() is None


@needs_four_devices
def test_model_axis_must_divide_the_devices():
    with pytest.raises(ValueError, match="divide the number of devices"):
        distribute.model_parallel(3)
    with pytest.raises(TypeError, match="model_axis must be an int"):
        distribute.model_parallel(2.0)
    assert keras.distribution.distribution() is None


@pytest.mark.skipif(BACKEND == "jax", reason="the refusal on the other backends")
def test_other_backends_are_refused():
    with pytest.raises(NotImplementedError, match="JAX only"):
        distribute.model_parallel(2)


def test_the_layout_covers_every_kernel_and_the_embedding():
    """A renamed layer would silently stay whole: every kernel and the
    embedding of build_model's model must match one pattern."""
    names = [w.path for w in model().weights]
    for name in names:
        matches = [p for p in distribute.MODEL_PARALLEL_LAYOUT if re.fullmatch(p, name)]
        assert len(matches) <= 1, name
        if name.endswith(("kernel", "embeddings")):
            assert matches, name
