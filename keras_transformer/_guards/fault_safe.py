"""A failed ``fit``, ``evaluate`` or ``predict`` leaves the model's weights intact.

Keras' JAX trainer (3.15) detaches the variables' values from the model while
it loops: the values travel through the jitted steps as a state tuple, each
step donates (frees) its input buffers, and the newest state is re-attached
only when the loop ends, by ``fit`` alone in a ``finally``. Any exception in
``predict`` or ``evaluate`` (bad data found while tracing, an error in a
callback, Ctrl-C), or in the first step of ``fit``, left every variable
without a value: the model could not even be saved.

``guard(model)`` wraps such a call. While it runs, the model records the
newest values the trainer handed to a step or got back from one
(``remember``); on any exception they are assigned back, so the model holds
the weights of its last completed step. A donated buffer is lost only if a
step fails while it runs on the device, after its inputs were consumed; so
the model checks every batch on the host before it enters a compiled step
(``checked_step``), and bad data fails before anything is donated.

TensorFlow and PyTorch update variables in place, and a failed step stops
before the optimizer's update (our in-graph checks are attached to the data
that the update depends on), so ``guard`` has nothing to restore there.

These guards hook into Keras' trainers below their public API (the JAX
trainer's state, a variable's attached value, the trainer methods of
``private_api.TRAINER_HOOKS``), through ``private_api`` alone. They run on
the Keras releases the test suite runs (``private_api.TESTED_KERAS``) whose
trainer still has every hook; otherwise they stand aside, with one warning
(``active``), and the model trains as a plain ``keras.Model`` does, its
inputs still checked.
"""

import contextlib
import threading

import keras
import numpy as np

from keras_transformer._guards import checks as _checks
from keras_transformer._guards import inputs as _inputs
from keras_transformer._guards import private_api
from keras_transformer.distribute import cluster


def active(model=None):
    """Whether the guards run (``private_api.fault_guards``): else False,
    with one warning."""
    return private_api.fault_guards(model)


# ``records``: {id(model): {id(variable): (variable, newest value)}} for the
# models inside a guarded call of this thread. Kept off the model: Keras
# tracks the variables found in a layer's attributes, and would count these
# as the model's own. Per thread: the trainer runs each call's steps on the
# thread that made it, so a call on another thread neither counts as nested
# in this one nor writes into its record.
_local = threading.local()


def _records():
    records = getattr(_local, "records", None)
    if records is None:
        records = _local.records = {}
    return records


def guarding(model):
    """Whether a guarded call of ``model`` runs on this thread."""
    return id(model) in _records()


def _is_jax():
    return keras.backend.backend() == "jax"


def _state_variables(model, kind):
    """The variable lists, in the order of the trainer's state tuple."""
    groups = [model.trainable_variables, model.non_trainable_variables]
    if kind == "train":
        groups.append(model.optimizer.variables)
    if kind in ("train", "test"):
        groups.append(model.metrics_variables)
    return groups


def remember(model, variables, values):
    """Record ``values`` as the newest known values of ``variables``."""
    record = _records().get(id(model))
    if record is None:
        return
    for variable, value in zip(variables, values, strict=True):
        if value is not None:
            record[id(variable)] = (variable, value)


def remember_current(model, groups):
    """Record the variables' attached values (before the trainer detaches them)."""
    for variables in groups:
        values = [private_api.attached_value(v) for v in variables]
        remember(model, variables, values)


def checked_step(model, step_function):
    """``step_function`` (one jitted step) with a host check of its batch first,
    and its output state remembered.

    In one process every batch is checked whole on the host (or refused), so
    the step runs, and is traced, with the layers' checks left out (each a
    host callback in the jitted step). Several processes' global arrays are
    not all on this host: their steps keep the layers' checks.
    """
    alone = cluster.process_count() == 1

    def step(state, data):
        checked = _inputs.check_batch(model, data)
        if alone and not checked:
            raise ValueError(
                "A batch whose inputs cannot be read on the host: give NumPy "
                "arrays or tensors of this backend."
            )
        with _checks.inputs_checked() if alone else contextlib.nullcontext():
            outputs, new_state = step_function(state, data)
        kind = {4: "train", 3: "test", 2: "predict"}.get(len(new_state))
        if kind is not None:
            for variables, values in zip(
                _state_variables(model, kind), new_state, strict=True
            ):
                remember(model, variables, values)
        return outputs, new_state

    return step


def checked_torch_step(model, kind, compiled):
    """The ``torch.compile``d step ``compiled`` (Keras' ``train_function``,
    ``test_function`` or ``predict_function``, as named by ``kind``) with its
    batch checked on the host first, then handed over as tensors.

    Inside the compiled step every value check (token ids in range, a
    sequence not empty or too long) reads values back to the host: a graph
    break each, and NumPy batches traced through Dynamo's NumPy support
    break it more. Checked here once per batch, the step runs with no checks
    inside (``_checks.inputs_checked``); what the checks catch and the
    message they raise are the same.
    """
    import torch

    if kind == "train_function":
        # Keras compiles a wrapper that calls `train_step`; Dynamo traces the
        # step again for every frame above its graph break at
        # `loss.backward()`. Compiled itself, the step is traced twice (to
        # find the break, then to stop there), not three times.
        step_function = torch.compile(model.train_step)
    else:

        def step_function(batch):
            return compiled([batch])

    def step(data):
        (batch,) = data  # one batch per call: PyTorch's steps_per_execution is 1
        _inputs.check_batch(model, batch)
        batch = keras.tree.map_structure(_as_tensor, batch)
        with _checks.inputs_checked():
            return step_function(batch)

    return step


def _as_tensor(value):
    if isinstance(value, np.ndarray):
        return keras.ops.convert_to_tensor(value)
    return value


def _usable(value):
    if value is None:
        return False
    is_deleted = getattr(value, "is_deleted", None)
    return not (is_deleted is not None and is_deleted())


def _restore(model, record):
    # A variable that still has a value holds the newest one (the trainer
    # re-attached it, or never detached it); only detached ones are restored.
    lost = []
    for variable, value in record.values():
        if not _usable(private_api.attached_value(variable)) and _usable(value):
            variable.assign(value)
    for variable in model.variables:
        if not _usable(private_api.attached_value(variable)):
            lost.append(variable.path)
    private_api.forget_jax_state(model)
    return lost


@contextlib.contextmanager
def guard(model):
    """Run one trainer call; on any exception, reattach the newest good values."""
    records = _records()
    if not _is_jax() or id(model) in records or not active(model):
        # Other backends keep their variables; a nested call (fit's
        # validation runs evaluate) is covered by the outer guard.
        yield
        return
    record = records[id(model)] = {}
    remember_current(model, [model.variables, model.metrics_variables])
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        remember_current(model, [optimizer.variables])
    try:
        yield
    except BaseException as error:
        lost = _restore(model, record)
        if lost:
            # Only a step that failed while running on the device can do
            # this; say so rather than leave a model that fails later.
            error.add_note(
                f"keras_transformer: {len(lost)} variables lost their values "
                f"in the failed step (e.g. {lost[0]}); rebuild or reload the "
                "model."
            )
        raise
    finally:
        del records[id(model)]


@contextlib.contextmanager
def checked_tf_step(model, data):
    """TensorFlow graphs: every op of the step waits for the batch's checks.

    The layers' asserts stop whatever is computed from the ids, but a step
    also has ops that read no data (the optimizer's iteration count, metric
    counters), and a graph runs those even when an assert fails. Created
    under these control dependencies, they run only after the checks pass.
    """
    if keras.backend.backend() != "tensorflow":
        yield
        return
    import tensorflow as tf

    if tf.executing_eagerly() or model.jit_compile or not active():
        # Eagerly the layers' checks raise before the update. XLA drops
        # asserts (see _checks.nan_unless_in_range), and a step under these
        # control dependencies cannot create its variables on XLA.
        yield
        return
    checks = _inputs.graph_checks(model, data)
    if not checks:
        yield
        return
    # The step's layers check nothing again: their asserts would repeat these.
    with tf.control_dependencies(checks), _checks.inputs_checked():
        yield
