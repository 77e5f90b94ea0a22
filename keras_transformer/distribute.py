"""Data-parallel training: a model replica per device, each batch split over them.

``data_parallel()`` sets this up for the current Keras backend:

- **JAX**: ``keras.distribution.DataParallel`` over all devices of the default
  kind (GPUs or TPUs if any, else the CPU), set as Keras' global
  distribution. Variables are replicated on every device, each input batch is
  sharded along its first axis, and the whole step is one ``jax.jit`` over the
  global batch, so losses and gradients are those of the global batch.
  With ``KERAS_DISTRIBUTION_JOB_ADDRESSES`` set (several hosts),
  ``keras.distribution.initialize()`` joins the cluster first; then
  ``data_parallel()`` must come before any other JAX work, and each process
  feeds its own share of every global batch.
- **TensorFlow**: ``tf.distribute.MirroredStrategy`` over all local GPUs (the
  CPU if there are none). Within ``fit``/``evaluate`` each replica runs the
  step on its slice of the batch and the gradients are summed across
  replicas. A per-token mean loss equals the single-device loss only if each
  replica divides by the token count of the whole batch; Keras' own scaling
  by ``1 / num_replicas`` is exact only when every slice holds as many real
  tokens (see ``keras_transformer.losses``).
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


class DataParallelSetup:
    """What ``data_parallel()`` set up.

    Also a context manager: ``with data_parallel() as setup:`` calls
    ``close()`` on exit.

    Attributes:
        num_replicas: int, how many model replicas (devices) share a batch;
            every batch's rows must be a multiple of it.
        description: str, e.g. ``"JAX DataParallel over 4 cpu devices"``.
        backend: str, the Keras backend it was set up for.
    """

    def __init__(self, num_replicas, description, backend, scope, close):
        self.num_replicas = int(num_replicas)
        self.description = description
        self.backend = backend
        self._scope = scope
        self._close = close

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
        "or train without --data-parallel."
    )


def _jax_data_parallel():
    # Multi-host: must join the cluster before JAX sees its devices, or
    # list_devices() would return this host's devices only.
    if os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES"):
        keras.distribution.initialize()
    devices = keras.distribution.list_devices()
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=devices)
    )

    def restore():
        keras.distribution.set_distribution(previous)

    kind = devices[0].split(":")[0]
    description = f"JAX DataParallel over {len(devices)} {kind} devices"
    processes = keras.distribution.distribution().num_processes
    if processes > 1:
        description += f" in {processes} processes"
    return DataParallelSetup(
        len(devices), description, "jax", contextlib.nullcontext, restore
    )


def _tensorflow_data_parallel():
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy()
    devices = ", ".join(strategy.extended.worker_devices)
    replicas = strategy.num_replicas_in_sync
    description = f"TensorFlow MirroredStrategy over {replicas} devices ({devices})"
    return DataParallelSetup(replicas, description, "tensorflow", strategy.scope, None)
