"""What differs between TensorFlow, JAX and PyTorch, in one place.

The rest of the package is written in ``keras.ops``; where a backend needs
its own code (compiling a decoding loop, telling traced values from concrete
ones, stopping on a bad value inside a compiled step, working around a fused
kernel that fails), it calls a function of this module.
"""

import contextlib
import functools
import logging
import threading

import keras
import numpy as np
from keras import ops


def name():
    return keras.backend.backend()


# -- traced or concrete -------------------------------------------------------


def concrete_value(x):
    """A NumPy array if ``x`` is concrete, else ``None`` (a traced JAX value, a
    TensorFlow graph tensor, a tensor inside ``torch.compile``)."""
    backend = name()
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


def is_traced(value):
    """True for a JAX tracer or a TensorFlow graph tensor: a value whose
    contents the host cannot read now."""
    backend = name()
    if backend == "jax":
        import jax

        return isinstance(value, jax.core.Tracer)
    if backend == "tensorflow":
        import tensorflow as tf

        return isinstance(value, tf.Tensor) and not tf.executing_eagerly()
    return False


# -- stopping on a bad value inside a compiled computation --------------------


def out_of_range(values, low, high, message):
    """The error message if some of ``values`` (NumPy) fall outside
    ``[low, high)``, else None; ``message`` gets ``{lo}``/``{hi}``."""
    values = np.asarray(values)
    if values.size and (values.min() < low or values.max() >= high):
        return message.format(lo=values.min(), hi=values.max())
    return None


if name() == "torch":
    import torch

    @torch.compiler.disable
    def _outside_torch_graph(x, low, high, message):
        """The eager check, left out of ``torch.compile``'s graph: it runs on
        the real values between two compiled graphs, so a compiled step
        (``jit_compile=True``) raises the same ``ValueError`` as an eager one."""
        text = out_of_range(ops.convert_to_numpy(x), low, high, message)
        if text is not None:
            raise ValueError(text)


def check_in_graph(x, low, high, message, output, on_jax_failure):
    """Stop the computation unless ``low <= x < high`` everywhere, where the
    values are not known on the host (traced or compiled code).

    ``message`` gets ``{lo}``/``{hi}``. PyTorch (inside ``torch.compile``)
    raises ``ValueError``; JAX calls ``on_jax_failure(text)`` from a host
    callback; TensorFlow asserts. Returns ``output``, on TensorFlow with the
    assertion attached to it, so that nothing computed from it (an optimizer
    update, say) runs when the check fails.
    """
    backend = name()
    if backend == "torch":  # inside torch.compile
        _outside_torch_graph(x, low, high, message)
        return output
    lo, hi = ops.min(x), ops.max(x)
    if backend == "tensorflow":
        import tensorflow as tf

        ok = tf.logical_and(lo >= low, hi < high)
        # XLA (jit_compile=True) drops Assert ops; callers that can poison
        # their output with NaN use `nan_unless_in_range` so that nothing
        # passes silently there either.
        check = tf.debugging.Assert(
            ok, [message.format(lo="?", hi="?"), "lowest:", lo, "highest:", hi]
        )
        with tf.control_dependencies([check]):
            return tf.identity(output)
    if backend == "jax":
        import jax

        def _report(lo_value, hi_value):
            text = out_of_range([lo_value, hi_value], low, high, message)
            if text is not None:
                on_jax_failure(text)

        jax.debug.callback(_report, lo, hi)
    return output


def nan_unless_in_range(values, x, low, high):
    """TensorFlow graphs only: ``values`` or, if some ``x`` is outside
    ``[low, high)``, NaN. Under XLA the Assert of ``check_in_graph`` is
    dropped, and an XLA gather clamps bad indices to finite garbage; NaN
    shows it. Elsewhere ``values``."""
    if name() != "tensorflow" or isinstance(x, keras.KerasTensor):
        return values
    import tensorflow as tf

    if tf.executing_eagerly():
        return values
    ok = tf.logical_and(tf.reduce_min(x) >= low, tf.reduce_max(x) < high)
    return tf.where(ok, values, tf.constant(float("nan"), values.dtype))


# -- attention ----------------------------------------------------------------


def fused_attention_fails(dtype, d_k, d_v):
    """Cases where ``keras.ops.dot_product_attention`` fails on the JAX backend
    (Keras 3.15.1, JAX 0.10.2), so the explicit path must compute them:

    - d_v != d_k: it reshapes the output to the query's shape and raises;
    - float16 under ``jax.jit`` on the CPU: it asks XLA for a float16 x float16
      -> float32 dot, which XLA:CPU rejects ("precision 'F16_F16_F32' is not
      supported by dot_general on CPU").
    """
    if name() != "jax":
        return False
    if d_k != d_v:
        return True
    if keras.backend.standardize_dtype(dtype) != "float16":
        return False
    import jax

    return jax.default_backend() == "cpu"


def fused_attention_is_slower(x):
    """Cases where ``keras.ops.dot_product_attention`` works but the explicit
    path is faster: PyTorch's CPU kernel in bfloat16, where the explicit
    path's products go to oneDNN's bfloat16 matrix products. GPUs keep the
    fused kernel."""
    if name() != "torch":
        return False
    if keras.backend.standardize_dtype(x.dtype) != "bfloat16":
        return False
    return getattr(x, "device", None) is not None and x.device.type == "cpu"


# -- the dtype policy that trains fastest -------------------------------------

# CPU flags of the BF16 instructions oneDNN uses for bfloat16 matrix products.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(path="/proc/cpuinfo"):
    """The CPU's feature flags as a set (Linux), or an empty set."""
    try:
        with open(path) as file:
            for line in file:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def fastest_policy(flags=None):
    """``"mixed_bfloat16"`` where it trains faster and as well, else
    ``"float32"``.

    That is TensorFlow on a CPU with BF16 instructions: oneDNN runs bfloat16
    products faster than float32 there, and the built-in task trains as well
    (docs/results.md). XLA:CPU (JAX) gains little from bfloat16; PyTorch's
    and the GPUs' quality under it is unverified, so they keep float32.
    """
    if name() != "tensorflow":
        return "float32"
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return "float32"
    flags = cpu_flags() if flags is None else flags
    return "mixed_bfloat16" if flags & set(BF16_CPU_FLAGS) else "float32"


def flash_attention_flag():
    """The ``flash_attention`` argument for ``keras.ops.dot_product_attention``.

    ``None`` lets Keras probe whether a flash kernel applies. On PyTorch
    (Keras 3.15) the probe builds a ``torch.backends.cuda.SDPAParams``, a
    C++ object that ``torch.compile`` cannot trace: a graph break in every
    attention of a compiled step. ``False`` skips the probe and calls
    ``torch.nn.functional.scaled_dot_product_attention`` unrestricted, which
    picks the flash kernel by itself where one applies (CUDA).
    """
    return False if name() == "torch" else None


# -- decoding loops -----------------------------------------------------------

_compilations = 0
_compilations_lock = threading.Lock()


class _Retracing(logging.Filter):
    def filter(self, record):
        return "triggered tf.function retracing" not in record.getMessage()


@contextlib.contextmanager
def deliberate_retracing():
    """TensorFlow's warning of a function traced again and again, held back
    where the tracing is deliberate (a warm-up traces each search at every
    shape): TensorFlow counts together the traces of the functions that
    share their Python code, as the compiled searches of one kind do."""
    logger = logging.getLogger("tensorflow")  # TensorFlow's, by its name
    quiet = _Retracing()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def compilations():
    """How many times this process has traced (and so compiled) a function
    that ``compile_loop`` built: the searches and the attention maps.

    What a server reports and a test reads to see that nothing compiled
    after warm-up: a request that compiles waits seconds, and every other
    request waits behind it. Always 0 on PyTorch, where nothing compiles.
    """
    return _compilations


def _counted(fn):
    """``fn`` that adds one to ``compilations()`` each time it runs: under
    ``jax.jit`` and ``tf.function`` the Python body runs once per trace."""

    @functools.wraps(fn)
    def traced(*args):
        global _compilations
        # Two threads may trace at once (two models, or two keys).
        with _compilations_lock:
            _compilations += 1
        return fn(*args)

    return traced


def compile_loop(model, fn):
    """``fn(*tensors)`` compiled for the backend, reading the model's weights:
    ``jax.jit`` with the weights as arguments (not constants baked into the
    program: the same compilation serves the weights after a further
    ``fit()`` or a checkpoint load), ``tf.function(jit_compile=True)`` (XLA)
    on TensorFlow, an eager call under ``torch.no_grad()`` on PyTorch.
    Each trace on JAX and TensorFlow counts in ``compilations()``."""
    backend = name()
    if backend == "jax":
        import jax

        variables = list(getattr(model, "variables", []))
        counted = _counted(fn)

        @jax.jit
        def run(values, *args):
            with keras.StatelessScope(
                state_mapping=list(zip(variables, values, strict=True))
            ):
                return counted(*args)

        return lambda *args: run([v.value for v in variables], *args)
    if backend == "tensorflow":
        import tensorflow as tf

        # autograph=False: the loops are ops.while_loop already, and
        # AutoGraph's rewriting of every layer's source costs more than the
        # tracing itself.
        return tf.function(_counted(fn), jit_compile=True, autograph=False)
    if backend == "torch":
        import torch

        def run(*args):
            with torch.no_grad():
                return fn(*(ops.convert_to_tensor(arg) for arg in args))

        return run
    return fn


# -- data parallelism ---------------------------------------------------------


def sum_over_replicas(x):
    """Inside a ``tf.distribute`` replica: the sum of ``x`` over the replicas.
    Elsewhere (one replica, JAX and PyTorch, which compute on the global
    batch) ``x`` itself."""
    if name() != "tensorflow":
        return x
    import tensorflow as tf

    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    context = tf.distribute.get_replica_context()
    if replicas > 1 and context is not None:
        return context.all_reduce(tf.distribute.ReduceOp.SUM, x)
    return x


def fixes_input_signature_from_first_batches():
    """Keras' TensorFlow trainer fixes a ``PyDataset``'s input signature from
    its first two batches; the others trace per shape."""
    return name() == "tensorflow"
