"""Several processes training one model on JAX: joining, agreeing, one writer.

Data parallel over several processes (hosts, or processes on one host) runs
one ``jax.jit`` step over every process's devices: each process feeds its
share of the global batch and all of them must take the same steps in the
same order, or the step's collectives wait forever. So whatever a process
decides on its own (stop now, the run's state, the tokenizer) is decided by
process 0 (the *chief*) and broadcast; only the chief writes files.

Everything here is a no-op or an identity on one process.
"""

import contextlib
import json
import os

import keras
import numpy as np

# How long a process that has finished waits at exit for the others (JAX's
# shutdown barrier; its default, 5 minutes, would end the chief's run while it
# averages checkpoints, saves the translator and scores the test set, which
# the other processes do not wait for).
FINISH_SECONDS = 6 * 3600

_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
_COUNT = "KERAS_DISTRIBUTION_NUM_PROCESSES"
_INDEX = "KERAS_DISTRIBUTION_PROCESS_ID"


def join():
    """Join the cluster named by Keras' own variables (as
    ``keras.distribution.initialize()`` reads them), once.

    ``KERAS_DISTRIBUTION_JOB_ADDRESSES``: ``host:port`` of every process,
    comma-separated (the first is the coordinator, which process 0 serves),
    or the coordinator's alone; ``KERAS_DISTRIBUTION_NUM_PROCESSES``: how
    many (default: the number of addresses); ``KERAS_DISTRIBUTION_PROCESS_ID``:
    this process's index, 0 to n - 1.

    Raises:
        ValueError: the variables are missing or do not agree.
    """
    import jax

    if jax.distributed.is_initialized():
        return
    addresses = [a for a in os.environ.get(_ADDRESSES, "").split(",") if a.strip()]
    try:
        count = int(os.environ.get(_COUNT) or len(addresses))
        index = int(os.environ[_INDEX])
    except (KeyError, ValueError):
        raise ValueError(
            f"{_ADDRESSES} is set, so {_INDEX} must be this process's index "
            f"(0 to n - 1) and {_COUNT} an integer. Received: "
            f"{_INDEX}={os.environ.get(_INDEX)!r}, {_COUNT}={os.environ.get(_COUNT)!r}"
        ) from None
    if not addresses or len(addresses) not in (1, count) or not 0 <= index < count:
        raise ValueError(
            f"{_ADDRESSES} must list the coordinator (or all {count} processes) "
            f"and {_INDEX} must be in [0, {count}). Received: "
            f"{_ADDRESSES}={os.environ.get(_ADDRESSES)!r}, {_INDEX}={index}"
        )
    coordinator = addresses[0].strip()
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=count,
            process_id=index,
            shutdown_timeout_seconds=FINISH_SECONDS,
        )
    except jax.errors.JaxRuntimeError as error:
        role = "start the coordinator at" if index == 0 else "join the coordinator at"
        raise ValueError(
            f"process {index} of {count} could not {role} {coordinator} "
            f"(a port in use, or an address this host cannot reach?): {error}"
        ) from None


def process_count():
    """How many processes train together (1 unless ``join()`` was called)."""
    if keras.backend.backend() != "jax":
        return 1
    import jax

    return jax.process_count() if jax.distributed.is_initialized() else 1


def process_index():
    """This process's index, 0 to ``process_count() - 1``."""
    if process_count() == 1:
        return 0
    import jax

    return jax.process_index()


def is_chief():
    """Whether this process writes: process 0, or the only one."""
    return process_index() == 0


def broadcast(value):
    """Process 0's ``value`` (anything JSON can hold), on every process.

    Every process must call it at the same point; what the others pass is
    ignored.
    """
    if process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    data = json.dumps(value).encode() if is_chief() else b""
    size = int(multihost_utils.broadcast_one_to_all(np.array(len(data), "int32")))
    buffer = np.zeros(size, "uint8")
    if is_chief():
        buffer[:] = np.frombuffer(data, "uint8")
    buffer = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    return json.loads(buffer.tobytes().decode())


def broadcast_flag(flag):
    """Process 0's ``flag`` (bool) on every process: one small collective,
    cheap enough for every batch."""
    if process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.array(bool(flag), "int32")))


def largest(value):
    """The largest of every process's ``value`` (an int), on every process:
    one small collective (an "any" for flags)."""
    if process_count() == 1:
        return int(value)
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.array(int(value), "int32"))
    return int(np.max(gathered))


@contextlib.contextmanager
def without_distribution():
    """No Keras distribution inside (the one before is put back after).

    For what one process does alone while the others train or wait: Keras'
    saving creates a throwaway optimizer, and a variable created under a
    multi-process distribution is placed on every process's devices, a
    collective the other processes never join.
    """
    if keras.backend.backend() != "jax":
        yield
        return
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)
