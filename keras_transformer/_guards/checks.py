"""Value checks that raise the same message on every backend.

Shapes are checked where they are known while tracing. Values (token ids,
lengths) are only known when the computation runs, and each backend needs its
own way to stop on a bad value:

- eager tensors (PyTorch, eager TensorFlow/JAX): checked at once, ``ValueError``;
- a ``tf.function`` graph: ``tf.debugging.Assert`` (``InvalidArgumentError``);
- a traced JAX function: a host callback that raises (``JaxRuntimeError``).

The message is the same in all cases. JAX needs this most: its gather returns
NaN for an out-of-range index instead of failing.
"""

import contextlib
import threading

import keras
from keras import ops

from keras_transformer import backend
from keras_transformer._guards import private_api

# Each thread's own scopes: a server's search on a worker thread and a
# ``predict`` on the main one must not see, reset or raise each other's.
_local = threading.local()

# The lists of failed checks of the ``deferred_value_errors`` blocks now
# open, by thread. A JAX host callback may run on a runtime thread (on
# GPUs) that has no scope of its own; it can only find its block here.
_open_deferred = {}
_open_deferred_lock = threading.Lock()


@contextlib.contextmanager
def inputs_checked():
    """Leave the value checks out while the block runs (and while it traces):
    what it computes on was checked already (``_inputs``)."""
    outer = inputs_were_checked()
    # True while a call or step runs on inputs already checked (on the host,
    # or ahead of a TensorFlow graph's ops): the layers' value checks stand
    # aside. Inside a compiled step each would otherwise read the values
    # back to the host (a graph break on PyTorch, a callback on JAX) or
    # repeat an assert. Tracing runs on the calling thread, so it is that
    # thread's flag.
    _local.inputs_checked = True
    try:
        yield
    finally:
        _local.inputs_checked = outer


def inputs_were_checked():
    return getattr(_local, "inputs_checked", False)


@contextlib.contextmanager
def deferred_value_errors():
    """Raise failed JAX in-graph checks as ``ValueError`` after the block ends.

    Keras' JAX trainer (3.15.1) detaches the variables' values while
    ``predict``/``evaluate`` loop and re-attaches them only when the loop ends
    normally (``fit`` alone does it in a ``finally``). A check that raised
    inside the jitted step would leave the model without weights; deferred,
    the loop ends, the model stays usable, and the error is raised here.

    The failures are the calling thread's: a block open on another thread
    neither collects nor clears them.
    """
    thread = threading.get_ident()
    outer, errors = getattr(_local, "deferred", None), []
    _local.deferred = errors
    with _open_deferred_lock:
        _open_deferred[thread] = errors
    try:
        yield
    finally:
        _local.deferred = outer
        with _open_deferred_lock:
            if outer is None:
                del _open_deferred[thread]
            else:
                _open_deferred[thread] = outer
    if errors:
        raise ValueError(errors[0])


def _is_symbolic(x):
    return isinstance(x, keras.KerasTensor)


def _check_values(value, low, high, message):
    text = backend.out_of_range(value, low, high, message)
    if text is not None:
        raise ValueError(text)


def check_range(x, low, high, message, output=None):
    """Raise unless ``low <= x < high`` everywhere; ``message`` gets ``{lo}``/``{hi}``.

    Returns ``output`` (default ``x``); on TensorFlow graphs with the
    assertion attached to it, so that whatever is computed from it (an
    optimizer update, say) cannot run when the check fails.
    """
    output = x if output is None else output
    if _is_symbolic(x) or inputs_were_checked():
        return output
    value = backend.concrete_value(x)
    if value is not None:
        _check_values(value, low, high, message)
        return output
    return backend.check_in_graph(x, low, high, message, output, _fail)


def _fail(text):
    errors = getattr(_local, "deferred", None)
    if errors is None and _on_runtime_thread():
        with _open_deferred_lock:
            blocks = list(_open_deferred.values())
        # The callback's block is the one open, if only one is; with several
        # (or none) it raises, and JAX hands the error to the thread whose
        # computation ran the check.
        if len(blocks) == 1:
            errors = blocks[0]
    if errors is None:
        raise ValueError(text)
    errors.append(text)


def _on_runtime_thread():
    """Whether this thread was started outside Python (a JAX runtime thread
    running a host callback for a computation launched on another thread).
    On the CPU callbacks run on the launching thread itself, whose own
    blocks are the only ones that apply."""
    return private_api.started_outside_python()


nan_unless_in_range = backend.nan_unless_in_range


def check_integer(x, name):
    """Token ids must be integers: a float id is a bug, never silently rounded."""
    try:
        dtype = keras.backend.standardize_dtype(x.dtype)
    except ValueError:  # e.g. NumPy strings or objects: no Keras dtype at all
        dtype = str(x.dtype)
    if "int" not in dtype:
        raise TypeError(
            f"{name} must hold integer token ids. Received dtype={dtype}. "
            "Convert the ids with `numpy.asarray(ids, dtype='int32')` first."
        )


def check_not_empty(x, name, output=None):
    """Raise unless the last axis of ``x`` (the sequence) has at least one element.

    A sequence of no tokens has nothing to attend to: encoder attention over
    it is a softmax over nothing (NaN or a silent uniform, depending on the
    backend). Returns ``output`` (default ``x``), on TensorFlow graphs with
    the check attached as in ``check_range``.
    """
    length = static_dim(x, -1)
    if length == 0:
        raise ValueError(
            f"{name} must hold at least one token per sequence. "
            f"Received: shape={tuple(x.shape)}"
        )
    if length is not None or _is_symbolic(x):
        return x if output is None else output
    return check_range(
        ops.reshape(ops.shape(x)[-1], (1,)),
        1,
        2**31 - 1,
        f"{name} must hold at least one token per sequence. Received length {{lo}}.",
        output=x if output is None else output,
    )


def static_dim(x, axis):
    """The size of ``axis`` if known while tracing, else ``None``."""
    dim = x.shape[axis]
    try:
        return None if dim is None else int(dim)
    except Exception:  # a symbolic dimension (JAX shape polymorphism)
        return None


def check_same_batch(a, b, a_name, b_name):
    """Raise when two sequences that pair up row by row have different batch sizes."""
    batch_a, batch_b = static_dim(a, 0), static_dim(b, 0)
    if batch_a is not None and batch_b is not None and batch_a != batch_b:
        raise ValueError(
            f"{a_name} and {b_name} must have the same batch size. "
            f"Received: {a_name}.shape={tuple(a.shape)}, "
            f"{b_name}.shape={tuple(b.shape)}"
        )
