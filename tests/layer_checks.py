"""`run_layer_test`: the checks every layer of the package must pass.

Modelled on the checks keras-hub runs for its layers (written here from
scratch): eager call with the right shape and dtype, weight counts, a
symbolic call, a `get_config` round trip, a `.keras` save and reload with
equal outputs, one `fit` step, and the same under mixed precision with every
sub-layer on the layer's dtype policy.
"""

import os

import keras
import numpy as np
from keras import ops


class MaskProbe(keras.layers.Layer):
    """Returns the Keras mask it receives, as float32; fails if there is none."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is None:
            raise AssertionError("No Keras mask reached this layer.")
        return ops.cast(mask, "float32")

    def compute_mask(self, inputs, previous_mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1])


def _to_numpy(x):
    return ops.convert_to_numpy(x)


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def _symbolic_inputs(input_data):
    return {
        name: keras.Input(
            shape=tuple(np.shape(value)[1:]),
            batch_size=np.shape(value)[0],
            dtype=keras.backend.standardize_dtype(np.asarray(value).dtype),
            name=name,
        )
        for name, value in input_data.items()
    }


def _functional(layer, input_data, call_kwargs):
    inputs = _symbolic_inputs(input_data)
    outputs = _first(layer(**inputs, **call_kwargs))
    return keras.Model(inputs, outputs)


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    expected_output_shape,
    expected_num_trainable_weights,
    expected_num_non_trainable_weights=0,
    call_kwargs=None,
    tmp_path=None,
    run_training_check=True,
    run_mixed_precision_check=True,
):
    call_kwargs = call_kwargs or {}
    input_data = {k: np.asarray(v) for k, v in input_data.items()}

    # Eager call: shape, dtype, finiteness, weight counts.
    layer = layer_cls(**init_kwargs)
    output = _first(layer(**input_data, **call_kwargs))
    assert tuple(output.shape) == tuple(expected_output_shape)
    assert keras.backend.standardize_dtype(output.dtype) == layer.compute_dtype
    assert np.isfinite(_to_numpy(output)).all()
    assert len(layer.trainable_weights) == expected_num_trainable_weights
    assert len(layer.non_trainable_weights) == expected_num_non_trainable_weights

    # Symbolic call (no batch size known).
    symbolic = {
        name: keras.KerasTensor((None,) + value.shape[1:], dtype=value.dtype)
        for name, value in input_data.items()
    }
    fresh = layer_cls(**init_kwargs)
    symbolic_output = _first(fresh(**symbolic, **call_kwargs))
    assert tuple(symbolic_output.shape)[1:] == tuple(expected_output_shape)[1:]

    # Config round trip: every constructor argument survives.
    config = layer.get_config()
    revived = layer_cls.from_config(config)
    assert revived.get_config() == config

    # `.keras` save and reload, with no custom_objects, gives equal outputs.
    model = _functional(layer_cls(**init_kwargs), input_data, call_kwargs)
    expected = _to_numpy(model(input_data))
    if tmp_path is not None:
        path = os.path.join(str(tmp_path), f"{layer_cls.__name__}.keras")
        model.save(path)
        reloaded = keras.saving.load_model(path)
        np.testing.assert_allclose(
            _to_numpy(reloaded(input_data)), expected, rtol=1e-6, atol=1e-6
        )

    # One fit step runs and gives a finite loss.
    if run_training_check:
        model.compile(optimizer="sgd", loss="mse")
        target = np.zeros(expected.shape, "float32")
        history = model.fit(input_data, target, batch_size=len(target), verbose=0)
        assert np.isfinite(history.history["loss"][0])

    # Mixed precision: outputs in the compute dtype, variables in float32,
    # every sub-layer on the same policy.
    if run_mixed_precision_check:
        for policy in ("mixed_float16", "mixed_bfloat16"):
            mixed = layer_cls(**init_kwargs, dtype=policy)
            out = _first(mixed(**input_data, **call_kwargs))
            compute = policy.split("_")[1]
            assert keras.backend.standardize_dtype(out.dtype) == compute, policy
            assert np.isfinite(_to_numpy(ops.cast(out, "float32"))).all(), policy
            for weight in mixed.weights:
                assert keras.backend.standardize_dtype(weight.dtype) == "float32"
            # `_flatten_layers` is private, but it is the one way to reach
            # sub-layers created in `build` and check their policy.
            for sub in mixed._flatten_layers(include_self=False):
                assert sub.dtype_policy.name == policy, (sub.name, sub.dtype_policy)
            if run_training_check:
                model = _functional(
                    layer_cls(**init_kwargs, dtype=policy), input_data, call_kwargs
                )
                model.compile(optimizer="sgd", loss="mse")
                out_shape = tuple(np.shape(expected))
                history = model.fit(
                    input_data,
                    np.zeros(out_shape, "float32"),
                    batch_size=out_shape[0],
                    verbose=0,
                )
                assert np.isfinite(history.history["loss"][0]), policy
    return layer
