"""Data-parallel training: a model replica per device, each batch split over them.

``data_parallel()`` sets this up for the current Keras backend:

- **JAX**: ``keras.distribution.DataParallel`` over all devices of the default
  kind (GPUs or TPUs if any, else the CPU), set as Keras' global
  distribution. Variables are replicated on every device, each input batch is
  sharded along its first axis, and the whole step is one ``jax.jit`` over the
  global batch, so losses and gradients are those of the global batch.
  With ``KERAS_DISTRIBUTION_JOB_ADDRESSES`` set (several processes or
  hosts), ``keras_transformer.distribute.cluster.join()`` joins the cluster first (the
  variables of ``keras.distribution.initialize()``); then ``data_parallel()``
  must come before any other JAX work, and each process feeds its own share
  of every global batch (Keras' ``auto_shard_dataset`` is off: it shards only
  a ``tf.data.Dataset``).
- **TensorFlow**: ``tf.distribute.MirroredStrategy`` over all local GPUs (the
  CPU if there are none). Within ``fit``/``evaluate`` each replica runs the
  step on its slice of the batch and the gradients are summed across
  replicas. A per-token mean loss equals the single-device loss only if each
  replica divides by the token count of the whole batch; Keras' own scaling
  by ``1 / num_replicas`` is exact only when every slice holds as many real
  tokens (see ``keras_transformer.model.losses``).
- **PyTorch** and other backends: not available; Keras has no data-parallel
  training for them (see ``data_parallel``).

Either way, batches must split evenly: give ``rows_multiple=num_replicas`` to
``keras_transformer.data.batching.make_batches`` / ``BucketedDataset``.

Usage::

    setup = kt.data_parallel()
    with setup.scope():
        model = kt.build_model(...)
        model.compile(...)
    model.fit(...)
    setup.close()  # optional: back to single-device training (JAX)
"""

import contextlib
import os

import keras

from keras_transformer.atomic import variable_bytes
from keras_transformer.distribute import cluster


class DataParallelSetup:
    """What ``data_parallel()`` set up.

    Also a context manager: ``with data_parallel() as setup:`` calls
    ``close()`` on exit.

    Attributes:
        num_replicas: int, how many model replicas (devices) share a batch;
            every batch's rows must be a multiple of it.
        description: str, e.g. ``"JAX DataParallel over 4 cpu devices"``.
        backend: str, the Keras backend it was set up for.
        process_index, num_processes: this process's index and how many
            processes train together (``0, 1`` on one process). With
            several, each feeds rows ``[i·r/n, (i+1)·r/n)`` of every global
            batch of ``r`` rows (``BucketedDataset(process_shard=(i, n))``).
    """

    def __init__(
        self, num_replicas, description, backend, scope, close, process=(0, 1)
    ):
        self.num_replicas = int(num_replicas)
        self.description = description
        self.backend = backend
        self.process_index, self.num_processes = (int(p) for p in process)
        self._scope = scope
        self._close = close

    @property
    def is_chief(self):
        """Whether this is process 0, the one that writes files and logs."""
        return self.process_index == 0

    def scope(self):
        """Context manager to build **and** compile the model in.

        Under TensorFlow, variables (the model's and the optimizer's) must be
        created inside ``strategy.scope()`` to be mirrored. Under JAX the
        global distribution already covers everything created after
        ``data_parallel()``; the scope is then a no-op, kept so that the same
        code serves both backends.
        """
        return self._scope()

    def close(self):
        """Undo ``data_parallel()``'s global setting; safe to call twice.

        JAX: restores the Keras distribution that was set before (usually
        none), so later models are single-device again. Models built while
        the setup was active keep their replicated variables, but should not
        be trained after ``close()``: Keras' JAX trainer reads the global
        distribution at every step. TensorFlow: nothing to undo (the strategy
        is only active inside ``scope()``).
        """
        if self._close is not None:
            self._close()
            self._close = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        return f"<DataParallelSetup {self.description}>"


def data_parallel():
    """Set up data-parallel training on all local devices of the backend.

    Build and compile the model inside the returned ``scope()``; train as
    usual with ``fit`` (or ``train_on_batch`` under JAX; under TensorFlow only
    ``fit``/``evaluate`` with a dataset split the batch, ``train_on_batch``
    runs the whole batch on every replica).

    Returns:
        A ``DataParallelSetup`` with ``num_replicas``, ``description``,
        ``scope()`` and ``close()``.

    Raises:
        NotImplementedError: on the torch backend (and any backend other
            than JAX and TensorFlow). The installed Keras has no data-parallel
            training there: ``keras.distribution`` is implemented for JAX
            only (there is no ``keras/src/backend/torch/distribution_lib.py``,
            and ``keras.src.backend.distribution_lib`` is ``None`` on torch),
            TensorFlow uses ``tf.distribute``, and the torch trainer runs on
            one device.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        return _jax_data_parallel()
    if backend == "tensorflow":
        return _tensorflow_data_parallel()
    raise NotImplementedError(
        f"Keras {keras.__version__} has no data-parallel training for the "
        f"{backend} backend (keras.distribution supports JAX; TensorFlow uses "
        "tf.distribute). Use KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow, "
        "or train on one device."
    )


def _jax_data_parallel():
    devices = _jax_devices()
    kind = devices[0].split(":")[0]
    return _jax_setup(
        keras.distribution.DataParallel(
            devices=devices, auto_shard_dataset=cluster.process_count() == 1
        ),
        len(devices),
        f"JAX DataParallel over {len(devices)} {kind} devices",
    )


def _jax_devices():
    """Every process's devices, after joining the cluster if there is one."""
    # Multi-host: must join the cluster before JAX sees its devices, or
    # list_devices() would return this host's devices only.
    if os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES"):
        cluster.join()
    return keras.distribution.list_devices()


def _jax_setup(distribution, num_replicas, description):
    """Set ``distribution`` as Keras' global one; its ``DataParallelSetup``.

    Several processes: each gives fit() its own share of every batch (Keras'
    auto-sharding takes a tf.data.Dataset only, hence ``auto_shard_dataset``
    off there), and Keras joins the shares into the global batch
    (``make_array_from_process_local_data``).
    """
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(distribution)

    def restore():
        keras.distribution.set_distribution(previous)

    processes = cluster.process_count()
    if processes > 1:
        description += f" in {processes} processes"
    return DataParallelSetup(
        num_replicas,
        description,
        "jax",
        contextlib.nullcontext,
        restore,
        process=(cluster.process_index(), processes),
    )


# Megatron-style tensor parallelism (Shoeybi et al., 2019) for the variables
# of build_model, by path: the first product of each pair is split by columns
# (each device computes whole heads, or a slice of the d_ff hidden units), the
# second by rows, so each pair needs one sum across the model axis. The
# embedding, shared with the pre-softmax projection (§3.4), is split along
# d_model. Layer norms and output biases are small and replicated.
# Keys are regular expressions that must match a variable's whole path
# (Keras' LayoutMap uses re.fullmatch).
MODEL_PARALLEL_LAYOUT = {
    r".*embeddings": (None, "model"),
    r".*/(query|key|value)/kernel": (None, "model"),
    r".*/(query|key|value)/bias": ("model",),
    r".*/attention_output/kernel": ("model", None),
    r".*/ffn_inner/kernel": (None, "model"),
    r".*/ffn_inner/bias": ("model",),
    r".*/ffn_outer/kernel": ("model", None),
}


def model_parallel(model_axis):
    """Shard the weights over ``model_axis`` devices and the batch over the rest.

    JAX only: ``keras.distribution.ModelParallel`` over a ``(batch, model)``
    mesh of all devices (``len(devices) // model_axis`` rows), with the
    layouts of ``MODEL_PARALLEL_LAYOUT``: each device holds about
    ``1 / model_axis`` of the attention and feed-forward kernels and of the
    embedding. ``num_heads``, ``d_model`` and ``d_ff`` must be multiples of
    ``model_axis``. Build the model after this call (variables take their
    layout when they are created).

    Args:
        model_axis: int >= 1 dividing the number of devices.

    Returns:
        A ``DataParallelSetup`` whose ``num_replicas`` is the size of the
        batch axis (every batch's rows must be a multiple of it).

    Raises:
        NotImplementedError: on backends other than JAX.
        ValueError: if ``model_axis`` does not divide the number of devices.
    """
    backend = keras.backend.backend()
    if backend != "jax":
        raise NotImplementedError(
            f"Model parallelism uses keras.distribution.ModelParallel, which "
            f"Keras {keras.__version__} implements for JAX only; the backend "
            f"is {backend}. Use KERAS_BACKEND=jax."
        )
    devices = _jax_devices()
    if isinstance(model_axis, bool) or not isinstance(model_axis, int):
        raise TypeError(f"model_axis must be an int. Received: {model_axis!r}")
    if model_axis < 1 or len(devices) % model_axis:
        raise ValueError(
            f"model_axis must be >= 1 and divide the number of devices "
            f"({len(devices)}). Received: {model_axis}"
        )
    batch = len(devices) // model_axis
    mesh = keras.distribution.DeviceMesh(
        (batch, model_axis), ["batch", "model"], devices
    )
    layout_map = keras.distribution.LayoutMap(mesh)
    for pattern, axes in MODEL_PARALLEL_LAYOUT.items():
        layout_map[pattern] = axes
    return _jax_setup(
        keras.distribution.ModelParallel(
            layout_map=layout_map,
            batch_dim_name="batch",
            auto_shard_dataset=cluster.process_count() == 1,
        ),
        batch,
        f"JAX ModelParallel over {len(devices)} {devices[0].split(':')[0]} devices: "
        f"weights split {model_axis} ways, batches {batch} ways",
    )


def weight_bytes_per_device(model):
    """``{device: bytes}`` of ``model``'s weights (not the optimizer's) held by
    each of this process's devices (JAX); ``{"all": bytes}`` elsewhere.
    Their sum over one copy: ``weight_bytes(model)``."""
    if keras.backend.backend() != "jax":
        return {"all": weight_bytes(model)}
    held = {}
    for weight in model.weights:
        for shard in weight.value.addressable_shards:
            held[str(shard.device)] = held.get(str(shard.device), 0) + shard.data.nbytes
    return held


def weight_bytes(model):
    """Bytes of one whole copy of ``model``'s weights."""
    return variable_bytes(model.weights)


def _tensorflow_data_parallel():
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy()
    devices = ", ".join(strategy.extended.worker_devices)
    replicas = strategy.num_replicas_in_sync
    description = f"TensorFlow MirroredStrategy over {replicas} devices ({devices})"
    return DataParallelSetup(replicas, description, "tensorflow", strategy.scope, None)
