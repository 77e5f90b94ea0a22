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

import keras
from keras import ops

# While `deferred_value_errors` is active: the messages of failed checks that
# ran inside compiled JAX code, to be raised once the compiled loop is over.
_deferred = None


@contextlib.contextmanager
def deferred_value_errors():
    """Raise failed JAX in-graph checks as ``ValueError`` after the block ends.

    Keras' JAX trainer (3.15.1) detaches the variables' values while
    ``predict``/``evaluate`` loop and re-attaches them only when the loop ends
    normally (``fit`` alone does it in a ``finally``). A check that raised
    inside the jitted step would leave the model without weights; deferred,
    the loop ends, the model stays usable, and the error is raised here.
    """
    global _deferred
    outer, _deferred = _deferred, []
    try:
        yield
        errors = _deferred
    finally:
        _deferred = outer
    if errors:
        raise ValueError(errors[0])


def _is_symbolic(x):
    return isinstance(x, keras.KerasTensor)


def _eager_value(x):
    """A NumPy array if ``x`` is concrete, else ``None`` (traced/graph tensor)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly() or not hasattr(x, "numpy"):
            return None
    elif backend == "jax":
        import jax

        if isinstance(x, jax.core.Tracer):
            return None
    elif backend == "torch":
        import torch

        if torch.compiler.is_compiling():
            return None
    return ops.convert_to_numpy(x)


def _check_values(value, low, high, message):
    if value.size and (value.min() < low or value.max() >= high):
        raise ValueError(message.format(lo=value.min(), hi=value.max()))


if keras.backend.backend() == "torch":
    import torch

    @torch.compiler.disable
    def _check_outside_torch_graph(x, low, high, message):
        """The eager check, left out of `torch.compile`'s graph: it runs on
        the real values between two compiled graphs, so a compiled step
        (`jit_compile=True`) raises the same ValueError as an eager one."""
        _check_values(ops.convert_to_numpy(x), low, high, message)


def check_range(x, low, high, message, output=None):
    """Raise unless ``low <= x < high`` everywhere; ``message`` gets ``{lo}``/``{hi}``.

    Returns ``output`` (default ``x``); on TensorFlow graphs with the
    assertion attached to it, so that whatever is computed from it (an
    optimizer update, say) cannot run when the check fails.
    """
    output = x if output is None else output
    if _is_symbolic(x):
        return output
    value = _eager_value(x)
    if value is not None:
        _check_values(value, low, high, message)
        return output

    backend = keras.backend.backend()
    if backend == "torch":  # inside torch.compile
        _check_outside_torch_graph(x, low, high, message)
        return output
    lo, hi = ops.min(x), ops.max(x)
    if backend == "tensorflow":
        import tensorflow as tf

        ok = tf.logical_and(lo >= low, hi < high)
        # XLA (jit_compile=True) drops Assert ops; callers that can poison
        # their output with NaN use `in_range` below so that nothing passes
        # silently there either.
        check = tf.debugging.Assert(
            ok, [message.format(lo="?", hi="?"), "lowest:", lo, "highest:", hi]
        )
        with tf.control_dependencies([check]):
            return tf.identity(output)
    if backend == "jax":
        import jax

        def _raise_if_out_of_range(lo_value, hi_value):
            if lo_value < low or hi_value >= high:
                text = message.format(lo=lo_value, hi=hi_value)
                if _deferred is None:
                    raise ValueError(text)
                _deferred.append(text)

        jax.debug.callback(_raise_if_out_of_range, lo, hi)
    return output


def nan_unless_in_range(values, x, low, high):
    """TensorFlow graphs only: ``values`` or, if some ``x`` is outside
    ``[low, high)``, NaN. Under XLA the Assert of ``check_range`` is dropped,
    and an XLA gather clamps bad indices to finite garbage; NaN shows it."""
    if keras.backend.backend() != "tensorflow" or _is_symbolic(x):
        return values
    import tensorflow as tf

    if tf.executing_eagerly():
        return values
    ok = tf.logical_and(tf.reduce_min(x) >= low, tf.reduce_max(x) < high)
    return tf.where(ok, values, tf.constant(float("nan"), values.dtype))


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
