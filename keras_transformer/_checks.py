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

import keras
from keras import ops


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


def check_range(x, low, high, message):
    """Raise unless ``low <= x < high`` everywhere; ``message`` gets ``{lo}``/``{hi}``.

    Returns ``x`` (on TensorFlow graphs, with the assertion attached to it).
    """
    if _is_symbolic(x):
        return x
    value = _eager_value(x)
    if value is not None:
        if value.size and (value.min() < low or value.max() >= high):
            raise ValueError(message.format(lo=value.min(), hi=value.max()))
        return x

    backend = keras.backend.backend()
    lo, hi = ops.min(x), ops.max(x)
    if backend == "tensorflow":
        import tensorflow as tf

        ok = tf.logical_and(lo >= low, hi < high)
        check = tf.debugging.Assert(
            ok, [message.format(lo="?", hi="?"), "lowest:", lo, "highest:", hi]
        )
        with tf.control_dependencies([check]):
            return tf.identity(x)
    if backend == "jax":
        import jax

        def _raise_if_out_of_range(lo_value, hi_value):
            if lo_value < low or hi_value >= high:
                raise ValueError(message.format(lo=lo_value, hi=hi_value))

        jax.debug.callback(_raise_if_out_of_range, lo, hi)
    return x


def check_integer(x, name):
    """Token ids must be integers: a float id is a bug, never silently rounded."""
    dtype = keras.backend.standardize_dtype(x.dtype)
    if "int" not in dtype:
        raise TypeError(
            f"{name} must hold integer token ids. Received dtype={dtype}. "
            "Convert the ids with `numpy.asarray(ids, dtype='int32')` first."
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
