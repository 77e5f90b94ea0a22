"""Data-parallel training: the same first step on N replicas as on one device."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.data.batching import make_batches

BACKEND = keras.backend.backend()
SEED = 7
VOCAB = 50
MODEL_ARGS = dict(
    src_vocab_size=VOCAB,
    share_embeddings=True,
    d_model=32,
    num_heads=2,
    d_ff=64,
    num_layers=1,
    max_length=16,
    dropout=0.0,
)


def fixed_batch(lengths, seed=0):
    """One (inputs, labels) batch of len(lengths) rows, padded to length 8.

    Example i has a source of lengths[i] ids plus END and a target of
    lengths[i] ids; batched by ``make_batches`` (start/end ids, padding).
    """
    rng = np.random.default_rng(seed)
    src = [rng.integers(3, VOCAB, n).tolist() + [2] for n in lengths]
    tgt = [rng.integers(3, VOCAB, n).tolist() for n in lengths]
    (batch,), _ = make_batches(src, tgt, 8 * len(lengths), [8], shuffle=False)
    return batch


def build_and_compile():
    keras.utils.set_random_seed(SEED)
    model = kt.build_model("tiny", **MODEL_ARGS)
    model.compile(
        optimizer=kt.transformer_optimizer(32, 10),
        loss=kt.LabelSmoothedCrossEntropy(),
    )
    return model


def first_step(model, inputs, labels, fit=False):
    """Weights before, loss, gradients and weights after one training step.

    Weights are the trainable ones (all of this model's). The gradients are
    read off Adam's first moments, ``(1 - beta_1) * gradient`` after one step.
    """

    def weights():
        return [np.asarray(v) for v in model.trainable_variables]

    initial = weights()
    if fit:
        history = model.fit(
            inputs, labels, batch_size=len(labels), shuffle=False, verbose=0
        )
        loss = history.history["loss"][0]
    else:
        loss = model.train_on_batch(inputs, labels)
    optimizer = model.optimizer
    moments = [v for v in optimizer.variables if v.name.endswith("_momentum")]
    assert len(moments) == len(initial)
    scale = 1.0 / (1.0 - optimizer.beta_1)
    return {
        "initial": initial,
        "loss": float(loss),
        "gradients": [np.asarray(m) * scale for m in moments],
        "after": weights(),
    }


def largest_differences(single, parallel):
    """Largest absolute differences between two ``first_step`` results.

    The weights after the step are compared where the gradient exceeds 1e-5
    only. Adam's first step is ``lr * g / (|g| + eps)`` with eps = 1e-9: where
    ``|g|`` is of the order of eps, rounding noise (a sum over rows taken in
    another order) changes the step by up to lr. The attention key biases are
    such weights: softmax ignores a shift of all keys, so their gradient is 0
    in exact arithmetic and ~1e-9 in float32.
    """

    def largest(*arrays):
        return max(
            float(np.abs(a - b).max(initial=0.0)) for a, b in zip(*arrays, strict=True)
        )

    determined = [np.abs(g) > 1e-5 for g in single["gradients"]]
    return {
        "initial": largest(single["initial"], parallel["initial"]),
        "gradients": largest(single["gradients"], parallel["gradients"]),
        "after": largest(
            [a[m] for a, m in zip(single["after"], determined, strict=True)],
            [b[m] for b, m in zip(parallel["after"], determined, strict=True)],
        ),
    }


def assert_same_first_step(single, parallel, differences):
    assert differences["initial"] == 0.0
    assert parallel["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert differences["gradients"] < 1e-6
    assert differences["after"] < 1e-5


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution is JAX-only")
def test_jax_data_parallel_first_step_matches_one_device():
    import jax

    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip(
            "needs >= 2 JAX devices; on CPU set "
            "XLA_FLAGS=--xla_force_host_platform_device_count=4"
        )
    # 8 rows with 2 per device (4 devices), holding 9, 14, 7 and 13 real
    # target tokens: a mean of per-shard means would differ from the global
    # per-token mean.
    inputs, labels = fixed_batch([6, 1, 5, 7, 2, 3, 7, 4])

    single = first_step(build_and_compile(), inputs, labels)
    keras.utils.clear_session()

    with kt.data_parallel() as setup:
        assert setup.num_replicas == len(devices)
        assert setup.description == (
            f"JAX DataParallel over {len(devices)} {devices[0].platform} devices"
        )
        distribution = keras.distribution.distribution()
        assert isinstance(distribution, keras.distribution.DataParallel)
        with setup.scope():
            model = build_and_compile()
        parallel = first_step(model, inputs, labels)

        # The batch is split along its rows; the variables are replicated.
        layout = distribution.get_data_layout(labels.shape).backend_layout
        assert layout.shard_shape(labels.shape) == (8 // len(devices), 8)
        variable = model.trainable_variables[0].value
        assert len(variable.sharding.device_set) == len(devices)
        assert variable.sharding.is_fully_replicated

    assert keras.distribution.distribution() is None
    assert_same_first_step(single, parallel, largest_differences(single, parallel))


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution is JAX-only")
def test_jax_close_restores_previous_distribution():
    setup = kt.data_parallel()
    assert keras.distribution.distribution() is not None
    setup.close()
    setup.close()
    assert keras.distribution.distribution() is None


# Runs in a fresh interpreter: TensorFlow's logical CPU devices must be set
# before TensorFlow initialises, and stay so for the whole process.
TF_SCRIPT = textwrap.dedent(
    """
    import contextlib, json, os, sys

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    if os.environ.get("KT_TF_GRAPPLER") == "0":  # as conftest.py does
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

    import keras_transformer as kt
    from tests.test_distribute import (
        build_and_compile, first_step, fixed_batch, largest_differences
    )

    setup = kt.data_parallel()
    result = {"num_replicas": setup.num_replicas, "description": setup.description}
    for name, lengths in json.loads(sys.argv[1]).items():
        inputs, labels = fixed_batch(lengths)
        # fit, not train_on_batch: only fit's dataset is split over the
        # replicas (train_on_batch runs the whole batch on each).
        single = first_step(build_and_compile(), inputs, labels, fit=True)
        with setup.scope():
            model = build_and_compile()
        parallel = first_step(model, inputs, labels, fit=True)
        result[name] = {
            "single": {"loss": single["loss"]},
            "parallel": {"loss": parallel["loss"]},
            "differences": largest_differences(single, parallel),
        }
    print("RESULT", json.dumps(result))
    """
)

# Rows 0-3 go to one replica, rows 4-7 to the other.
TF_BATCHES = {
    "balanced": [6, 2, 5, 3, 6, 2, 5, 3],  # 20 real target tokens on each
    "unbalanced": [7, 7, 7, 7, 1, 1, 1, 1],  # 32 and 8 real target tokens
}


@pytest.fixture(scope="module")
def mirrored_steps(tmp_path_factory):
    """First steps on one device and on 2 MirroredStrategy replicas."""
    script = tmp_path_factory.mktemp("mirrored") / "mirrored.py"
    script.write_text(TF_SCRIPT)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=repo)
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(TF_BATCHES)],
        env=env,
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["num_replicas"] == 2
    assert result["description"].startswith("TensorFlow MirroredStrategy over 2")
    return result


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute test")
def test_tensorflow_mirrored_first_step_matches_one_device(mirrored_steps):
    step = mirrored_steps["balanced"]
    assert_same_first_step(step["single"], step["parallel"], step["differences"])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute test")
def test_tensorflow_mirrored_uneven_tokens_match_one_device(mirrored_steps):
    step = mirrored_steps["unbalanced"]
    assert_same_first_step(step["single"], step["parallel"], step["differences"])


@pytest.mark.skipif(BACKEND != "torch", reason="torch backend only")
def test_torch_has_no_data_parallel():
    message = (
        r"Keras 3\.\S+ has no data-parallel training for the torch backend.*"
        r"KERAS_BACKEND=jax.*or train on one device"
    )
    with pytest.raises(NotImplementedError, match=message):
        kt.data_parallel()


def test_one_process_is_its_own_chief():
    """distribute.cluster on one process: identities, and process 0."""
    from keras_transformer.distribute import cluster

    assert cluster.process_count() == 1 and cluster.is_chief()
    assert cluster.process_index() == 0
    value = {"a": [1, 2.5, None], "b": "ü"}
    assert cluster.broadcast(value) == value
    assert cluster.broadcast_flag(1) is True
    before = keras.distribution.distribution() if BACKEND == "jax" else None
    with cluster.without_distribution():
        if BACKEND == "jax":
            assert keras.distribution.distribution() is None
    if BACKEND == "jax":
        assert keras.distribution.distribution() is before


@pytest.mark.once
@pytest.mark.parametrize(
    "variables, match",
    [
        ({"KERAS_DISTRIBUTION_PROCESS_ID": "2"}, r"must be in \[0, 2\)"),
        ({"KERAS_DISTRIBUTION_PROCESS_ID": "x"}, "must be this process's index"),
        ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "3"}, "must list the coordinator"),
    ],
)
def test_a_malformed_cluster_is_refused_before_joining(monkeypatch, variables, match):
    from keras_transformer.distribute import cluster

    monkeypatch.setenv("KERAS_DISTRIBUTION_JOB_ADDRESSES", "127.0.0.1:1,127.0.0.1:2")
    monkeypatch.setenv("KERAS_DISTRIBUTION_PROCESS_ID", "0")
    monkeypatch.delenv("KERAS_DISTRIBUTION_NUM_PROCESSES", raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        cluster.join()
