"""Tests of the §5.3 learning-rate schedule and optimizer (`schedules.py`).

Runs under every KERAS_BACKEND. References are float64 Python from the
paper's formula: lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5),
with step = optimizer iteration + 1.
"""

import json
import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.model.schedules import TransformerSchedule, transformer_optimizer


def paper_rate(step, d_model, warmup_steps, scale=1.0):
    """§5.3 in float64; ``step`` counts from 1."""
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def schedule_config(optimizer):
    """The schedule's config, read through the optimizer's public config."""
    learning_rate = optimizer.get_config()["learning_rate"]
    assert learning_rate["registered_name"] == "keras_transformer>TransformerSchedule"
    return learning_rate["config"]


def rate_at(schedule, iteration):
    return float(ops.convert_to_numpy(schedule(iteration)))


@pytest.mark.parametrize(
    "d_model, warmup_steps, scale", [(512, 4000, 1.0), (128, 100, 2.0), (1024, 1, 0.5)]
)
def test_values_match_the_formula(d_model, warmup_steps, scale):
    schedule = TransformerSchedule(d_model, warmup_steps=warmup_steps, scale=scale)
    w = warmup_steps
    for iteration in sorted({0, 1, w - 1, w, 10 * w}):
        expected = paper_rate(iteration + 1, d_model, w, scale)
        assert rate_at(schedule, iteration) == pytest.approx(expected, rel=1e-6)


def test_peak_is_at_step_warmup():
    d_model, w = 64, 50
    schedule = TransformerSchedule(d_model, warmup_steps=w)
    iterations = np.arange(0, 4 * w)
    rates = ops.convert_to_numpy(schedule(iterations)).astype("float64")
    reference = np.array([paper_rate(i + 1, d_model, w) for i in iterations])
    np.testing.assert_allclose(rates, reference, rtol=1e-6)
    # step = warmup_steps is optimizer iteration warmup_steps - 1.
    assert int(np.argmax(rates)) == w - 1
    assert rates.max() == pytest.approx((d_model * w) ** -0.5, rel=1e-6)
    assert np.all(np.diff(rates[:w]) > 0) and np.all(np.diff(rates[w - 1 :]) < 0)


def test_finite_and_positive_at_iteration_zero():
    schedule = TransformerSchedule(512)
    rate = schedule(0)
    assert keras.backend.standardize_dtype(rate.dtype) == "float32"
    value = float(ops.convert_to_numpy(rate))
    assert math.isfinite(value) and value > 0
    assert value == pytest.approx(512**-0.5 * 4000**-1.5, rel=1e-6)


def test_optimizer_hyperparameters_and_first_updates():
    opt = transformer_optimizer(16, warmup_steps=4)
    assert isinstance(opt, keras.optimizers.Adam)
    assert schedule_config(opt) == {
        "d_model": 16,
        "warmup_steps": 4,
        "scale": 1.0,
        "accumulate": 1,
    }
    assert (opt.beta_1, opt.beta_2, opt.epsilon) == (0.9, 0.98, 1e-9)
    variable = keras.Variable(np.zeros(3, "float32"))
    grad = np.array([0.5, -2.0, 1e-3], "float32")
    opt.build([variable])
    # With a constant gradient, Adam's bias-corrected step is lr · sign(g), so
    # two steps move by -(lr(step 1) + lr(step 2)) · sign(g): the first
    # update uses step_num = 1, not 0.
    for _ in range(2):
        opt.apply([ops.convert_to_tensor(grad)], [variable])
    moved = paper_rate(1, 16, 4) + paper_rate(2, 16, 4)
    np.testing.assert_allclose(
        ops.convert_to_numpy(variable), -moved * np.sign(grad), rtol=1e-5
    )
    assert float(ops.convert_to_numpy(opt.learning_rate)) == pytest.approx(
        paper_rate(3, 16, 4), rel=1e-6
    )


def test_config_round_trip():
    schedule = TransformerSchedule(256, warmup_steps=np.int64(300), scale=0.5)
    config = schedule.get_config()
    assert config == {
        "d_model": 256,
        "warmup_steps": 300,
        "scale": 0.5,
        "accumulate": 1,
    }
    json.dumps(config)  # plain Python numbers
    clone = TransformerSchedule.from_config(config)
    assert clone.get_config() == config
    assert rate_at(clone, 123) == rate_at(schedule, 123)

    serialized = keras.saving.serialize_keras_object(schedule)
    assert serialized["registered_name"] == "keras_transformer>TransformerSchedule"
    restored = keras.saving.deserialize_keras_object(json.loads(json.dumps(serialized)))
    assert isinstance(restored, TransformerSchedule)
    assert restored.get_config() == config


def test_saved_model_keeps_schedule_and_optimizer_state(tmp_path):
    # A small dense model: what matters is the optimizer, and it compiles fast.
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="dense")], name="net"
    )
    model.compile(
        optimizer=transformer_optimizer(32, warmup_steps=10, scale=2.0), loss="mse"
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4)).astype("float32")
    y = rng.normal(size=(8, 3)).astype("float32")
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)  # 2 optimizer steps
    path = tmp_path / "model.keras"
    model.save(path)

    loaded = keras.saving.load_model(path)  # no custom_objects
    assert schedule_config(loaded.optimizer) == {
        "d_model": 32,
        "warmup_steps": 10,
        "scale": 2.0,
        "accumulate": 1,
    }
    assert int(ops.convert_to_numpy(loaded.optimizer.iterations)) == 2
    assert float(ops.convert_to_numpy(loaded.optimizer.learning_rate)) == pytest.approx(
        paper_rate(3, 32, 10, 2.0), rel=1e-6
    )
    # Same order on both sides (paths may differ: the variables are renamed
    # when the optimizer is rebuilt on load).
    saved = [ops.convert_to_numpy(v) for v in model.optimizer.variables]
    restored = [ops.convert_to_numpy(v) for v in loaded.optimizer.variables]
    assert len(saved) == len(restored) == 1 + 4  # iterations; m, v of 2 weights
    for before, after in zip(saved, restored, strict=True):
        np.testing.assert_array_equal(after, before)
    assert all(np.any(v != 0) for v in saved[1:])  # Adam moments were updated


@pytest.mark.parametrize(
    "kwargs, name, value",
    [
        (dict(d_model=0), "d_model", "0"),
        (dict(d_model=-512), "d_model", "-512"),
        (dict(d_model=512, warmup_steps=0), "warmup_steps", "0"),
        (dict(d_model=512, warmup_steps=-1.5), "warmup_steps", "-1.5"),
        (dict(d_model=512, scale=0.0), "scale", "0.0"),
        (dict(d_model=512, scale=float("nan")), "scale", "nan"),
        (dict(d_model=float("inf")), "d_model", "inf"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, name, value):
    with pytest.raises(
        ValueError, match=f"{name} must be a positive number.*{name}={value}"
    ):
        TransformerSchedule(**kwargs)
    with pytest.raises(ValueError, match=name):
        transformer_optimizer(**kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [dict(d_model="512"), dict(d_model=512, scale=True)])
def test_non_numbers_raise_type_error(kwargs):
    with pytest.raises(TypeError, match="must be a positive number"):
        TransformerSchedule(**kwargs)
