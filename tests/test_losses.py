"""Tests of `LabelSmoothedCrossEntropy` and `MaskedAccuracy` (`losses.py`).

Runs under every KERAS_BACKEND. References are float64 NumPy written from
the definitions: q = (1 - ε)·onehot(y) + ε/V, loss = -Σ q log softmax(z),
averaged over the tokens whose target is not padding (id 0).
"""

import json

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.model.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model.transformer import build_model

BACKEND = keras.backend.backend()
VOCAB = 30
TINY = dict(num_layers=1, d_model=32, num_heads=4, d_ff=64, dropout=0.0)


def log_softmax(z):
    z = np.asarray(z, "float64")
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def smoothed_token_losses(logits, targets, eps):
    """-Σ_v q_v log p_v per token, with q built explicitly from the definition."""
    vocab = logits.shape[-1]
    q = np.full(logits.shape, eps / vocab)
    np.put_along_axis(q, targets[..., None], 1 - eps + eps / vocab, axis=-1)
    return -(q * log_softmax(logits)).sum(-1)


def reference_loss(logits, targets, eps, pad_id=0, weights=None):
    """Σ w · loss over non-padding tokens / number of non-padding tokens."""
    real = targets != pad_id
    tokens = smoothed_token_losses(logits, targets, eps)
    if weights is not None:
        tokens = tokens * (weights[:, None] if weights.ndim == 1 else weights)
    return (tokens * real).sum() / real.sum() if real.any() else 0.0


# One shape for all eager checks: JAX compiles each op once per shape.
B, T, V = 4, 6, 11
LENGTHS = [6, 4, 1, 3]


def padded_targets(rng, lengths=LENGTHS, length=T, vocab=V):
    """Ids in [1, vocab) followed by padding (0) after each row's length."""
    targets = rng.integers(1, vocab, (len(lengths), length))
    for row, n in enumerate(lengths):
        targets[row, n:] = 0
    return targets.astype("int32")


def random_logits(rng, scale=1.0):
    return (scale * rng.normal(size=(B, T, V))).astype("float32")


def value(x):
    return float(ops.convert_to_numpy(x))


@pytest.mark.slow
@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_matches_numpy_reference(rng, eps):
    logits = random_logits(rng, 3.0)
    targets = padded_targets(rng)
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)
    expected = reference_loss(logits, targets, eps)
    assert value(loss(targets, logits)) == pytest.approx(expected, abs=1e-5)
    # Probabilities instead of logits give the same loss.
    probs = np.exp(log_softmax(logits)).astype("float32")
    from_probs = LabelSmoothedCrossEntropy(label_smoothing=eps, from_logits=False)
    assert value(from_probs(targets, probs)) == pytest.approx(expected, abs=1e-5)


def test_is_the_uniform_over_vocabulary_variant(rng):
    # Keras' CategoricalCrossentropy(label_smoothing=ε) spreads ε over all V
    # classes too; on unpadded data the two must agree.
    logits = random_logits(rng)
    targets = padded_targets(rng, lengths=[T] * B)
    ours = LabelSmoothedCrossEntropy(label_smoothing=0.2)(targets, logits)
    keras_cce = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=0.2
    )
    theirs = keras_cce(np.eye(V, dtype="float32")[targets], logits)
    assert value(ours) == pytest.approx(value(theirs), abs=1e-5)


def test_stable_for_large_logits(rng):
    logits = random_logits(rng, 1e4)
    targets = padded_targets(rng)
    result = value(LabelSmoothedCrossEntropy()(targets, logits))
    assert np.isfinite(result)
    assert result == pytest.approx(reference_loss(logits, targets, 0.1), rel=1e-5)


def test_no_smoothing_is_masked_sparse_cross_entropy(rng):
    logits = random_logits(rng)
    targets = padded_targets(rng)
    real = targets != 0
    nll = -np.take_along_axis(log_softmax(logits), targets[..., None], -1)[..., 0]
    expected = nll[real].mean()
    result = LabelSmoothedCrossEntropy(label_smoothing=0.0)(targets, logits)
    assert value(result) == pytest.approx(expected, abs=1e-5)


def test_sample_weights_and_reductions(rng):
    logits = random_logits(rng)
    targets = padded_targets(rng)
    real = targets != 0
    tokens = smoothed_token_losses(logits, targets, 0.1) * real
    weights = np.array([1.0, 0.5, 2.0, 3.0], "float32")

    loss = LabelSmoothedCrossEntropy()
    expected = reference_loss(logits, targets, 0.1, weights=weights)
    assert value(loss(targets, logits, sample_weight=weights)) == pytest.approx(
        expected, abs=1e-5
    )
    token_weights = rng.uniform(size=(B, T)).astype("float32")
    expected = (tokens * token_weights).sum() / real.sum()
    assert value(loss(targets, logits, sample_weight=token_weights)) == pytest.approx(
        expected, abs=1e-5
    )
    total = LabelSmoothedCrossEntropy(reduction="sum")(targets, logits)
    assert value(total) == pytest.approx(tokens.sum(), rel=1e-5)
    per_token = LabelSmoothedCrossEntropy(reduction=None)(targets, logits)
    np.testing.assert_allclose(ops.convert_to_numpy(per_token), tokens, atol=1e-5)
    weighted_mean = LabelSmoothedCrossEntropy(reduction="mean_with_sample_weight")
    expected = (tokens * weights[:, None]).sum() / (real * weights[:, None]).sum()
    assert value(weighted_mean(targets, logits, weights)) == pytest.approx(
        expected, abs=1e-5
    )


def test_other_pad_id(rng):
    logits = random_logits(rng)
    targets = padded_targets(rng)
    targets = np.where(targets == 0, 5, np.where(targets == 5, 0, targets))
    assert np.any(targets == 0)  # 0 is now a real id
    loss = LabelSmoothedCrossEntropy(pad_id=5)
    assert value(loss(targets, logits)) == pytest.approx(
        reference_loss(logits, targets, 0.1, pad_id=5), abs=1e-5
    )
    # A pad id that is no valid index (PyTorch's -100 convention).
    ignore = np.where(targets == 5, -100, targets).astype("int32")
    assert value(LabelSmoothedCrossEntropy(pad_id=-100)(ignore, logits)) == (
        pytest.approx(reference_loss(logits, targets, 0.1, pad_id=5), abs=1e-5)
    )
    no_pad = LabelSmoothedCrossEntropy(pad_id=None)
    everything = smoothed_token_losses(logits, targets, 0.1).mean()
    assert value(no_pad(targets, logits)) == pytest.approx(everything, abs=1e-5)


def gradient(fn, x):
    """d fn(x) / dx as NumPy, on the current backend."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = fn(x)
        return out, tape.gradient(out, x).numpy()
    if BACKEND == "jax":
        import jax

        out, grad = jax.value_and_grad(fn)(x)
        return out, np.asarray(grad)
    import torch

    x = torch.tensor(x, requires_grad=True)
    out = fn(x)
    out.backward()
    return out, x.grad.numpy()


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gradient_is_softmax_minus_smoothed_target(rng, eps):
    """The loss' custom gradient against the calculus: d/dz of the mean over
    real tokens of -Σ q log softmax(z) is (softmax(z) - q) · w / N."""
    logits = random_logits(rng, 3.0)
    targets = padded_targets(rng)
    weights = rng.uniform(0.5, 2.0, size=(B, T)).astype("float32")
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)
    out, grad = gradient(lambda z: loss(targets, z, sample_weight=weights), logits)
    real = targets != 0
    q = np.full(logits.shape, eps / V)
    np.put_along_axis(q, targets[..., None], 1 - eps + eps / V, axis=-1)
    softmax = np.exp(log_softmax(logits))
    expected = (softmax - q) * (weights * real / real.sum())[..., None]
    np.testing.assert_allclose(grad, expected, atol=1e-6)
    assert value(out) == pytest.approx(
        reference_loss(logits, targets, eps, weights=weights), abs=1e-5
    )


@pytest.mark.slow
def test_all_padding_gives_zero_and_finite_gradients(rng):
    logits = random_logits(rng)
    targets = np.zeros((B, T), "int32")
    loss = LabelSmoothedCrossEntropy()
    out, grad = gradient(lambda z: loss(targets, z), logits)
    assert value(out) == 0.0
    assert np.all(np.isfinite(grad)) and np.all(grad == 0)
    # The same check must see non-zero gradients when there are real tokens.
    targets[0, 0] = 2
    _, grad = gradient(lambda z: loss(targets, z), logits)
    assert np.all(np.isfinite(grad)) and np.any(grad != 0)


def tiny_batch(rng, batch=6):
    """Teacher-forcing batch <s> w… </s> with padding (ids: 0 pad, 1 <s>, 2 </s>).

    Row lengths differ, so the decoder input holds </s> where the shifted
    target is already padding: the model's mask (from the decoder input)
    then keeps one position per padded row that the loss must skip.
    """
    lengths = [8, 5, 3, 6, 8, 4][:batch]
    tokens = rng.integers(3, VOCAB, (batch, 8))
    tokens[:, 0] = 1
    for row, n in enumerate(lengths):
        tokens[row, n - 1] = 2
        tokens[row, n:] = 0
    tokens = tokens.astype("int32")
    source = rng.integers(1, VOCAB, (batch, 7)).astype("int32")
    source[0, 4:] = 0
    return {"encoder_inputs": source, "decoder_inputs": tokens[:, :-1]}, tokens[:, 1:]


def tiny_model():
    return build_model("tiny", src_vocab_size=VOCAB, **TINY)


_JITTED = {}  # id(model) -> (model, jitted forward); keeps the model alive


def logits_of(model, x):
    """Inference logits as NumPy (jitted on JAX, where eager calls are slow)."""
    if BACKEND == "jax":
        import jax

        if id(model) not in _JITTED:

            def forward(trainable, non_trainable, x):
                return model.stateless_call(trainable, non_trainable, x)[0]

            _JITTED[id(model)] = (model, jax.jit(forward))
        forward = _JITTED[id(model)][1]
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        return np.asarray(forward(trainable, non_trainable, x))
    return ops.convert_to_numpy(model(x, training=False))


def real_accuracy(logits, targets):
    real = targets != 0
    return (logits.argmax(-1) == targets)[real].mean()


@pytest.mark.slow
def test_compiled_model_fit_evaluate_save_load(rng, tmp_path):
    """fit and evaluate average over real target tokens despite the model's mask.

    One model for several checks, because compiling each Keras step function
    takes seconds.
    """
    model = tiny_model()
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=LabelSmoothedCrossEntropy(label_smoothing=0.25),
        metrics=[MaskedAccuracy()],
    )
    x, y = tiny_batch(rng)
    logits = logits_of(model, x)
    expected = reference_loss(logits, y, 0.25)
    # Guard: averaging over the decoder-input mask would give another value.
    tokens = smoothed_token_losses(logits, y, 0.25) * (y != 0)
    assert abs(tokens.sum() / (x["decoder_inputs"] != 0).sum() - expected) > 1e-2

    # One batch per epoch and no dropout: the first epoch reports the loss
    # and accuracy of the initial weights.
    history = model.fit(x, y, batch_size=len(y), epochs=10, verbose=0).history
    losses = np.array(history["loss"])
    assert losses[0] == pytest.approx(expected, abs=1e-5)
    assert history["masked_accuracy"][0] == pytest.approx(
        real_accuracy(logits, y), abs=1e-6
    )
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.3

    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects
    assert isinstance(loaded.loss, LabelSmoothedCrossEntropy)
    assert loaded.loss.get_config() == model.loss.get_config()
    result = loaded.evaluate(x, y, batch_size=len(y), verbose=0, return_dict=True)
    trained = logits_of(model, x)
    assert result["loss"] == pytest.approx(reference_loss(trained, y, 0.25), abs=1e-5)
    assert result["masked_accuracy"] == pytest.approx(
        real_accuracy(trained, y), abs=1e-6
    )
    assert result["masked_accuracy"] > 0  # it has learnt something to compare


@pytest.mark.slow
def test_fit_under_mixed_float16(rng):
    keras.config.set_dtype_policy("mixed_float16")
    model = tiny_model()
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=LabelSmoothedCrossEntropy(),
        metrics=[MaskedAccuracy()],
    )
    x, y = tiny_batch(rng)
    logits = logits_of(model, x)
    assert logits.dtype == np.float32
    history = model.fit(x, y, batch_size=len(y), epochs=10, verbose=0).history
    losses = np.array(history["loss"])
    assert np.all(np.isfinite(losses))
    assert np.all(np.isfinite(history["masked_accuracy"]))
    # float16 activations: the first loss agrees with the float64 reference
    # to float16 precision.
    assert losses[0] == pytest.approx(reference_loss(logits, y, 0.1), rel=1e-2)
    assert losses[-1] < losses[0] - 0.3


def half_correct_targets(rng, logits, lengths=LENGTHS):
    """Padded targets where about half of the real tokens equal the argmax."""
    targets = padded_targets(rng, lengths)
    hits = rng.uniform(size=targets.shape) < 0.5
    return np.where(hits & (targets != 0), logits.argmax(-1), targets).astype("int32")


def test_masked_accuracy_over_two_batches(rng):
    metric = MaskedAccuracy()
    correct, total = 0, 0
    for lengths in ([6, 2, 0, 4], [3, 6, 1, 5]):
        logits = random_logits(rng)
        targets = half_correct_targets(rng, logits, lengths)
        real = targets != 0
        correct += ((logits.argmax(-1) == targets) & real).sum()
        total += real.sum()
        metric.update_state(targets, logits)
    assert 0 < correct < total
    assert value(metric.result()) == pytest.approx(correct / total, abs=1e-6)
    metric.reset_state()
    assert value(metric.result()) == 0.0


def test_masked_accuracy_sample_weights(rng):
    logits = random_logits(rng)
    targets = half_correct_targets(rng, logits)
    weights = np.array([1.0, 3.0, 0.5, 2.0], "float32")
    hits = logits.argmax(-1) == targets
    w = (targets != 0) * weights[:, None]
    expected = (w * hits).sum() / w.sum()
    unweighted = (hits & (targets != 0)).sum() / (targets != 0).sum()
    assert abs(expected - unweighted) > 1e-3  # the weights must matter
    metric = MaskedAccuracy()
    metric.update_state(targets, logits, sample_weight=weights)
    assert value(metric.result()) == pytest.approx(expected, abs=1e-6)


def test_config_round_trips():
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.2, pad_id=3, from_logits=False)
    config = loss.get_config()
    json.dumps(config)
    assert config["label_smoothing"] == 0.2 and config["pad_id"] == 3
    assert config["from_logits"] is False
    assert LabelSmoothedCrossEntropy.from_config(config).get_config() == config
    restored = keras.losses.deserialize(
        json.loads(json.dumps(keras.losses.serialize(loss)))
    )
    assert isinstance(restored, LabelSmoothedCrossEntropy)
    assert restored.get_config() == config

    metric = MaskedAccuracy(pad_id=7, name="acc")
    config = metric.get_config()
    assert config["pad_id"] == 7 and config["name"] == "acc"
    restored = keras.metrics.deserialize(
        json.loads(json.dumps(keras.metrics.serialize(metric)))
    )
    assert isinstance(restored, MaskedAccuracy)
    assert restored.get_config() == config


def test_bad_arguments():
    for kwargs, error, match in [
        (dict(label_smoothing=1.0), ValueError, "label_smoothing=1.0"),
        (dict(label_smoothing=-0.1), ValueError, "label_smoothing=-0.1"),
        (dict(label_smoothing="0.1"), TypeError, "label_smoothing='0.1'"),
        (dict(pad_id=0.5), TypeError, "pad_id=0.5"),
        (dict(reduction="average"), ValueError, "reduction"),
    ]:
        with pytest.raises(error, match=match):
            LabelSmoothedCrossEntropy(**kwargs)
    with pytest.raises(TypeError, match="pad_id='0'"):
        MaskedAccuracy(pad_id="0")
