"""Faults injected into fit, evaluate and predict: the model keeps its weights.

Each test breaks one call (bad data found before or inside a compiled step, an
exception in a callback, Ctrl-C, a loss that fails while tracing) and then
checks what matters to the user: the variables hold, bit for bit, the values
of the last completed step, and the model still predicts what it predicted.
On JAX, Keras' trainer detaches the variables while it loops; unguarded, such
a failure would leave the model without weights (keras_transformer._guards.fault_safe).
"""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from tests.test_model import _Batches as Batches  # batches through compiled steps

BACKEND = keras.backend.backend()
VOCAB = 40
MAX_LENGTH = 16
# The exception type of a check inside a compiled TensorFlow step; the message
# is the same as elsewhere.
STEP_ERROR = {"tensorflow": "InvalidArgumentError"}.get(BACKEND, "ValueError")


def tiny_model(loss=None):
    model = kt.build_model(
        "tiny",
        src_vocab_size=VOCAB,
        num_layers=1,
        d_model=16,
        num_heads=2,
        d_ff=32,
        dropout=0.0,
        max_length=MAX_LENGTH,
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=loss or kt.LabelSmoothedCrossEntropy(),
    )
    return model


def batch(seed, rows=4, src_len=5, tgt_len=4):
    rng = np.random.default_rng(seed)
    x = {
        "encoder_inputs": rng.integers(1, VOCAB, (rows, src_len)).astype("int32"),
        "decoder_inputs": rng.integers(1, VOCAB, (rows, tgt_len)).astype("int32"),
    }
    return x, rng.integers(1, VOCAB, (rows, tgt_len)).astype("int32")


def with_value(x, key, index, value):
    x = {name: ids.copy() for name, ids in x.items()}
    x[key][index] = value
    return x


def weights(model):
    """Every variable the user would lose: model, optimizer and metrics."""
    variables = list(model.variables) + list(model.optimizer.variables)
    return [np.array(keras.ops.convert_to_numpy(v.value)) for v in variables]


def assert_same(before, after):
    assert len(before) == len(after)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


class Recorder(keras.callbacks.Callback):
    """Weights after each completed training step, and an optional fault."""

    def __init__(self, fail_at=None, error=RuntimeError):
        super().__init__()
        self.after_step = []
        self.fail_at = fail_at
        self.error = error

    def on_train_batch_end(self, batch, logs=None):
        self.after_step.append(weights(self.model))
        if batch == self.fail_at:
            raise self.error("injected fault in a callback")


@pytest.fixture(scope="module")
def shared():
    """One model for the module, after one training step (so that the
    optimizer has state). Its compiled steps are reused across tests."""
    keras.utils.set_random_seed(7)
    model = tiny_model()
    x, y = batch(0)
    model.fit(x, y, epochs=1, verbose=0)
    return model, x, y


@pytest.fixture
def trained(shared):
    """The shared model, its batch and the logits it gives now."""
    model, x, y = shared
    return model, x, y, model.predict(x, verbose=0)


def assert_intact(model, before, x, expected):
    assert_same(before, weights(model))
    np.testing.assert_array_equal(model.predict(x, verbose=0), expected)


# -- predict / evaluate: a failing call changes nothing ------------------------

PREDICT_FAULTS = {
    "empty_source": lambda x: {**x, "encoder_inputs": np.zeros((4, 0), "int32")},
    "empty_target": lambda x: {**x, "decoder_inputs": np.zeros((4, 0), "int32")},
    "no_rows": lambda x: {name: ids[:0] for name, ids in x.items()},
    "list_not_dict": lambda x: [x["encoder_inputs"], x["decoder_inputs"]],
    "source_too_long": lambda x: {
        **x,
        "encoder_inputs": np.ones((4, MAX_LENGTH + 1), "int32"),
    },
    "id_out_of_range": lambda x: with_value(x, "encoder_inputs", (1, 1), VOCAB),
}


# A list and a batch of no rows are faults of the NumPy call; the rest also
# come as the second batch of a stream, into an already compiled step.
PREDICT_CASES = [(fault, False) for fault in sorted(PREDICT_FAULTS)] + [
    (fault, True)
    for fault in sorted(PREDICT_FAULTS)
    if fault not in ("list_not_dict", "no_rows")
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault,streamed",
    PREDICT_CASES,
    ids=[f"{f}-{'streamed' if s else 'numpy'}" for f, s in PREDICT_CASES],
)
def test_failed_predict_keeps_weights(trained, fault, streamed):
    model, x, _, expected = trained
    before = weights(model)
    bad = PREDICT_FAULTS[fault](x)
    # Streamed: the good batch first (JAX builds on it), the bad one second.
    data = Batches([(x,), (bad,)]) if streamed else bad
    with pytest.raises(Exception) as info:
        model.predict(data, verbose=0)
    if not streamed:
        assert type(info.value) is ValueError, info.value
    assert_intact(model, before, x, expected)


@pytest.mark.parametrize("streamed", [False, True], ids=["numpy", "streamed"])
def test_failed_evaluate_keeps_weights_and_metrics(trained, streamed):
    model, x, y, expected = trained
    before = weights(model)
    bad_y = y.copy()
    bad_y[0, 0] = VOCAB + 5
    data = Batches([(x, y), (x, bad_y)]) if streamed else None
    with pytest.raises(Exception, match=r"\[0, 40\)"):
        if streamed:
            model.evaluate(data, verbose=0)
        else:
            model.evaluate(x, bad_y, verbose=0)
    assert_intact(model, before, x, expected)
    # And evaluate still works, with the loss of the good data.
    assert np.isfinite(model.evaluate(x, y, verbose=0))


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("entry", ["predict", "evaluate"])
def test_callback_fault_in_predict_or_evaluate_keeps_weights(trained, entry, error):
    model, x, y, expected = trained
    before = weights(model)

    class Fail(keras.callbacks.Callback):
        def on_predict_batch_end(self, batch, logs=None):
            raise error("injected")

        def on_test_batch_end(self, batch, logs=None):
            raise error("injected")

    with pytest.raises(error):
        if entry == "predict":
            model.predict(x, verbose=0, callbacks=[Fail()])
        else:
            model.evaluate(x, y, verbose=0, callbacks=[Fail()])
    assert_intact(model, before, x, expected)


# -- fit: the weights of the last completed step -------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_callback_fault_in_fit_keeps_last_completed_step(trained, error):
    model, x, y, _ = trained
    recorder = Recorder(fail_at=1, error=error)
    with pytest.raises(error):
        model.fit(
            Batches([(x, y)] * 3),
            epochs=1,
            verbose=0,
            callbacks=[recorder],
            shuffle=False,
        )
    assert len(recorder.after_step) == 2
    assert_same(recorder.after_step[-1], weights(model))
    assert np.isfinite(model.predict(x, verbose=0)).all()


def bad_batch(x, y, fault):
    bad_x, bad_y = x, y.copy()
    if fault == "source_id":
        bad_x = with_value(x, "encoder_inputs", (2, 2), VOCAB + 1)
    elif fault == "target_id":
        bad_y[1, 1] = VOCAB
    elif fault == "negative_target":
        bad_y[1, 1] = -1
    else:
        bad_x = {**x, "encoder_inputs": np.zeros((4, 0), "int32")}
    return bad_x, bad_y


def assert_bad_data_error(error):
    message = str(error)
    assert "[0, 40)" in message or "at least one token" in message, message
    assert type(error).__name__ == STEP_ERROR


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault", ["source_id", "target_id", "negative_target", "empty_source"]
)
def test_bad_streamed_batch_in_fit_keeps_last_completed_step(shared, fault):
    model, x, y = shared
    recorder = Recorder()
    # Three good steps, then the bad batch: the fourth step must not happen.
    data = Batches([(x, y)] * 3 + [bad_batch(x, y, fault)])
    with pytest.raises(Exception) as info:
        model.fit(data, epochs=1, verbose=0, callbacks=[recorder], shuffle=False)
    if fault == "empty_source" and BACKEND == "tensorflow":
        # tf.data fixes the stream's shapes from its first batch: the empty
        # batch is refused there, before it reaches the step.
        assert "yielded an element of shape (4, 0)" in str(info.value)
    else:
        assert_bad_data_error(info.value)
    assert len(recorder.after_step) == 3, "the good steps ran"
    assert_same(recorder.after_step[-1], weights(model))
    # The model still trains and predicts.
    model.fit(x, y, epochs=1, verbose=0)
    assert np.isfinite(model.predict(x, verbose=0)).all()


@pytest.mark.slow
@pytest.mark.skipif(
    BACKEND == "torch", reason="Keras refuses steps_per_execution > 1 on PyTorch"
)
# On TensorFlow, under coverage's tracer and the other backends side by side,
# this test is several times slower; the lines it runs there are those of the
# single-step tests above (JAX's run measures it).
@(pytest.mark.no_cover if BACKEND == "tensorflow" else lambda test: test)
def test_bad_batch_inside_a_multi_step_execution_keeps_the_step_before(shared):
    """steps_per_execution=2: the bad fourth batch shares an execution with
    the good third, whose weights no callback sees. The reference is the same
    model, from the same start, trained on the three good batches alone (one
    model, so that the multi-step function is traced once)."""
    _, x, y = shared
    keras.utils.set_random_seed(11)
    model = tiny_model()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=kt.LabelSmoothedCrossEntropy(),
        steps_per_execution=2,
    )
    model.optimizer.build(model.trainable_variables)
    variables = list(model.variables) + list(model.optimizer.variables)
    start = weights(model)
    model.fit(Batches([(x, y)] * 3), epochs=1, verbose=0, shuffle=False)
    expected = weights(model)
    assert not all(np.array_equal(a, b) for a, b in zip(start, expected, strict=True))
    for variable, value in zip(variables, start, strict=True):
        variable.assign(value)
    data = Batches([(x, y)] * 3 + [bad_batch(x, y, "target_id")])
    with pytest.raises(Exception) as info:
        model.fit(data, epochs=1, verbose=0, shuffle=False)
    assert_bad_data_error(info.value)
    assert_same(expected, weights(model))


@pytest.mark.slow
def test_loss_that_fails_while_tracing_keeps_weights(trained):
    model, x, y, expected = trained
    before = weights(model)

    def broken_loss(y_true, y_pred):
        raise RuntimeError("injected fault in the loss")

    optimizer, loss = model.optimizer, model.loss
    model.compile(optimizer=optimizer, loss=broken_loss)
    try:
        with pytest.raises(RuntimeError, match="injected fault in the loss"):
            model.fit(x, y, epochs=1, verbose=0)
        assert_intact(model, before, x, expected)
    finally:
        model.compile(optimizer=optimizer, loss=loss)  # the module's model


@pytest.mark.slow
def test_failed_first_fit_keeps_initial_weights():
    """Before any step completes (the optimizer is built inside fit)."""
    keras.utils.set_random_seed(7)
    model = tiny_model()
    x, y = batch(0)
    initial = [np.array(keras.ops.convert_to_numpy(v.value)) for v in model.variables]
    expected = model.predict(x, verbose=0)
    with pytest.raises(Exception, match=r"\[0, 40\)"):
        model.fit(Batches([(x, np.full_like(y, VOCAB))]), epochs=1, verbose=0)
    after = [np.array(keras.ops.convert_to_numpy(v.value)) for v in model.variables]
    assert_same(initial, after)
    np.testing.assert_array_equal(model.predict(x, verbose=0), expected)
    model.fit(x, y, epochs=1, verbose=0)


@pytest.mark.slow
def test_weights_can_be_saved_after_a_failed_call(trained, tmp_path):
    model, x, _, expected = trained
    with pytest.raises(ValueError):
        model.predict({**x, "encoder_inputs": np.zeros((4, 0), "int32")}, verbose=0)
    path = tmp_path / "after_fault.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    np.testing.assert_allclose(reloaded.predict(x, verbose=0), expected, atol=1e-6)


# -- targets are checked like inputs --------------------------------------------

BAD_TARGETS = {
    "too_large": (lambda y: np.where(y == y[0, 0], VOCAB, y), ValueError, r"\[0, 40\)"),
    "negative": (lambda y: np.where(y == y[0, 0], -1, y), ValueError, r"from -1 "),
    "float": (lambda y: y.astype("float32") + 0.5, TypeError, r"integer token ids"),
    "other_shape": (lambda y: y[:, :3], ValueError, r"shape of decoder_inputs"),
}


@pytest.mark.parametrize("case", sorted(BAD_TARGETS))
@pytest.mark.parametrize("entry", ["fit", "evaluate"])
def test_bad_targets_are_refused_before_any_work(trained, case, entry):
    model, x, y, expected = trained
    before = weights(model)
    make, error, pattern = BAD_TARGETS[case]
    with pytest.raises(error, match=pattern):
        getattr(model, entry)(x, make(y), verbose=0)
    assert_intact(model, before, x, expected)


@pytest.mark.parametrize("case", ["too_large", "negative", "float"])
def test_bad_streamed_targets_never_give_a_loss(trained, case):
    """Inside the compiled step: an error, never a NaN or a finite wrong loss."""
    model, x, y, expected = trained
    before = weights(model)
    make, error, pattern = BAD_TARGETS[case]
    with pytest.raises(Exception) as info:
        model.evaluate(Batches([(x, make(y))]), verbose=0)
    if case == "float":
        # Refused by dtype on the host (JAX checks batches there), or for its
        # fractional part inside the step (Keras may pass whole ids as floats).
        assert "integer token ids" in str(info.value)
    else:
        assert "[0, 40)" in str(info.value)
    assert_intact(model, before, x, expected)


@pytest.mark.slow
def test_the_loss_pad_id_is_an_allowed_target(trained):
    """A loss that skips -1 (not 0) accepts -1 targets and refuses 0-padding ids
    only where they are out of range (0 is in the vocabulary)."""
    _, x, y, _ = trained
    keras.utils.set_random_seed(7)
    model = tiny_model(loss=kt.LabelSmoothedCrossEntropy(pad_id=-1))
    padded = y.copy()
    padded[:, -1] = -1
    loss = model.evaluate(x, padded, verbose=0)
    assert np.isfinite(loss)
    model.fit(Batches([(x, padded)]), epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"from -2 "):
        model.evaluate(x, np.where(padded == -1, -2, padded), verbose=0)


# -- Python lists, empty sequences -------------------------------------------


@pytest.mark.slow
def test_python_lists_of_ids_work_like_arrays(trained):
    model, x, y, expected = trained
    as_lists = {name: ids.tolist() for name, ids in x.items()}
    np.testing.assert_allclose(model.predict(as_lists, verbose=0), expected, atol=1e-6)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(as_lists)), expected, atol=1e-5
    )
    loss = model.evaluate(as_lists, y.tolist(), verbose=0)
    assert loss == pytest.approx(model.evaluate(x, y, verbose=0), rel=1e-6)


def test_ragged_python_lists_get_a_clear_error(trained):
    model, x, _, _ = trained
    ragged = {**x, "encoder_inputs": [[1, 2, 3], [4, 5]]}
    with pytest.raises(ValueError, match=r"encoder_inputs is a ragged list"):
        model.predict(ragged, verbose=0)


@pytest.mark.parametrize("entry", ["call", "predict", "fit", "evaluate"])
@pytest.mark.parametrize("side", ["encoder_inputs", "decoder_inputs"])
def test_empty_sequences_are_refused_on_every_path(trained, entry, side):
    model, x, y, _ = trained
    empty = {**x, side: np.zeros((4, 0), "int32")}
    targets = np.zeros((4, 0), "int32") if side == "decoder_inputs" else y
    with pytest.raises(ValueError, match=rf"{side} must hold at least one token"):
        if entry == "call":
            model(empty)
        elif entry == "predict":
            model.predict(empty, verbose=0)
        elif entry == "fit":
            model.fit(empty, targets, verbose=0)
        else:
            model.evaluate(empty, targets, verbose=0)


@pytest.mark.slow
def test_empty_streamed_sequences_are_refused_after_a_retrace(trained):
    """The second shape retraces the compiled step, whose checks must refuse
    the empty sequences (not with a wrong 'too long' message)."""
    model, x, y, _ = trained
    empty = {**x, "encoder_inputs": np.zeros((4, 0), "int32")}
    for _ in range(2):
        with pytest.raises(Exception, match=r"at least one token"):
            model.predict(Batches([(x,), (empty,)]), verbose=0)
        with pytest.raises(Exception, match=r"at least one token"):
            model.fit(Batches([(x, y), (empty, y)]), verbose=0, shuffle=False)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile is PyTorch's")
def test_range_check_inside_torch_compile_raises_the_eager_error():
    """Inside ``torch.compile`` the id check runs outside the compiled graph
    (``torch.compiler.disable``) on the real values, so a compiled step raises
    the ValueError of an eager one. ``backend="eager"``: dynamo's graph
    capture, which is what splits the graph, in a second; the full inductor
    path (a minute or more of C++ compilation) is
    test_model.py::test_compiled_training_under_mixed_bfloat16."""
    import torch

    from keras_transformer._guards import checks as _checks

    def step(ids):
        return (
            _checks.check_range(ids, 0, 5, "ids from {lo} to {hi}, not in [0, 5)") * 2
        )

    compiled = torch.compile(step, backend="eager")
    np.testing.assert_array_equal(
        compiled(torch.tensor([[0, 4, 2]])).numpy(), [[0, 8, 4]]
    )
    with pytest.raises(ValueError, match=r"ids from 1 to 5, not in \[0, 5\)"):
        compiled(torch.tensor([[1, 5, 2]]))


def test_the_guards_stand_aside_on_an_untested_keras(trained, monkeypatch):
    """They patch Keras' trainer below its public API: on a Keras they were
    not tested with, they say so once and do nothing (inputs still checked)."""
    import warnings

    from keras_transformer._guards import fault_safe as _fault_safe
    from keras_transformer._guards import private_api

    model, x, _, expected = trained
    recorded = []

    class Probe(keras.callbacks.Callback):
        def on_predict_batch_end(self, batch, logs=None):
            recorded.append(_fault_safe.guarding(model))

    model.predict(x, verbose=0, callbacks=[Probe()])
    # On JAX the guard records the step's values; elsewhere it has no need.
    assert recorded == [BACKEND == "jax"]

    monkeypatch.setattr(keras, "__version__", "3.99.0")
    monkeypatch.setattr(private_api, "_said", set())
    with pytest.warns(RuntimeWarning, match=r"tested with Keras 3\.15; Keras 3\.99"):
        assert _fault_safe.active() is False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        recorded.clear()
        np.testing.assert_array_equal(
            model.predict(x, verbose=0, callbacks=[Probe()]), expected
        )
    assert not [w for w in caught if "fault guards" in str(w.message)]  # once
    assert recorded == [False]
    with pytest.raises(ValueError, match="Token ids in encoder_inputs"):
        model.predict(with_value(x, "encoder_inputs", (1, 1), VOCAB), verbose=0)


def test_the_guards_stand_aside_where_keras_lacks_a_hook(trained, monkeypatch):
    """A Keras trainer method that the guards override or call, renamed in
    some release, would leave an override that is never called: the guards
    check that Keras has each one, and on a Keras without one they say so
    once and stand aside (inputs still checked)."""
    import warnings

    from keras_transformer._guards import fault_safe as _fault_safe
    from keras_transformer._guards import private_api

    model, x, _, expected = trained
    hooks = private_api.TRAINER_HOOKS.get(BACKEND, ())
    assert all(hasattr(keras.Model, name) for name in hooks)
    assert _fault_safe.active(model)
    recorded = []

    class Probe(keras.callbacks.Callback):
        def on_predict_batch_end(self, batch, logs=None):
            recorded.append(_fault_safe.guarding(model))

    renamed = {BACKEND: (*hooks, "_renamed_trainer_hook")}
    monkeypatch.setattr(private_api, "TRAINER_HOOKS", renamed)
    monkeypatch.setattr(private_api, "_said", set())
    with pytest.warns(RuntimeWarning, match=r"has no Model\._renamed_trainer_hook"):
        assert _fault_safe.active() is False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        np.testing.assert_array_equal(
            model.predict(x, verbose=0, callbacks=[Probe()]), expected
        )
    assert not [w for w in caught if "fault guards" in str(w.message)]  # once
    assert recorded == [False]
    with pytest.raises(ValueError, match="Token ids in encoder_inputs"):
        model.predict(with_value(x, "encoder_inputs", (1, 1), VOCAB), verbose=0)
