"""Training checkpoints written atomically, resumed, and averaged.

A checkpoint is a directory ``step-<iterations>`` holding the model's weights
with the optimizer's state (``model.weights.h5``, from ``model.save_weights``)
and ``state.json`` (epoch, batch within the epoch, optimizer iterations,
seconds trained). It is written under a temporary name and renamed when
complete, so a run killed at any moment (``kill -9`` included) leaves either
the previous checkpoints or the new one, never half of one: directories
whose names start with ``.tmp-`` are leftovers of an interrupted write and
are ignored (and removed by the next save).

Checkpoint averaging (§6.1: "we used a single model obtained by averaging the
last 5 checkpoints, which were written at 10-minute intervals"; the last 20
for the big models) is ``average_checkpoints``.
"""

import json
import os
import shutil
import uuid

import keras
import numpy as np

WEIGHTS_FILE = "model.weights.h5"
STATE_FILE = "state.json"
_PREFIX = "step-"
_TMP_PREFIX = ".tmp-"


def checkpoint_name(iterations):
    """Directory name of the checkpoint after ``iterations`` optimizer steps."""
    return f"{_PREFIX}{int(iterations):09d}"


def list_checkpoints(directory):
    """Complete checkpoint directories under ``directory``, oldest first.

    Args:
        directory: str or path; need not exist.

    Returns:
        list of str paths, sorted by optimizer step.
    """
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if (
            name.startswith(_PREFIX)
            and name[len(_PREFIX) :].isdigit()
            and os.path.isfile(os.path.join(path, STATE_FILE))
            and os.path.isfile(os.path.join(path, WEIGHTS_FILE))
        ):
            found.append((int(name[len(_PREFIX) :]), path))
    return [path for _, path in sorted(found)]


def read_state(path):
    """The ``state.json`` dict of the checkpoint directory ``path``."""
    with open(os.path.join(path, STATE_FILE), encoding="utf-8") as file:
        return json.load(file)


def save_checkpoint(model, directory, state, keep=None):
    """Write one checkpoint atomically; optionally keep only the newest ones.

    Args:
        model: a built (usually compiled) ``keras.Model``.
        directory: the checkpoints folder (created if missing).
        state: JSON-serialisable dict; ``state["iterations"]`` (int) names
            the checkpoint.
        keep: optional int >= 1, how many checkpoints to keep (oldest are
            deleted after the new one is in place); None keeps all.

    Returns:
        The path of the new checkpoint directory.
    """
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if name.startswith(_TMP_PREFIX):  # left by a write that was killed
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    name = checkpoint_name(state["iterations"])
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, _TMP_PREFIX + name)
    os.makedirs(tmp)
    model.save_weights(os.path.join(tmp, WEIGHTS_FILE))
    write_json_atomic(os.path.join(tmp, STATE_FILE), state)
    _fsync_dir(tmp)
    if os.path.exists(final):
        # The same step saved again (e.g. an epoch ends exactly at a periodic
        # save): the new copy replaces it in two renames.
        old = os.path.join(directory, _TMP_PREFIX + "old-" + name)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(directory)
    if keep is not None:
        for old in list_checkpoints(directory)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(model, path):
    """Restore weights (and the optimizer's state, if compiled); return state.

    The optimizer must be built before its variables can be assigned, so it
    is built here from the model's trainable variables when needed.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    model.load_weights(os.path.join(path, WEIGHTS_FILE))
    return read_state(path)


def average_checkpoints(model, paths):
    """Set ``model``'s weights to the mean of the weights in ``paths`` (§6.1).

    The mean is taken in float64 per variable over the model weights only
    (not the optimizer's moments); integer variables, if any, are taken from
    the last checkpoint. ``model``'s optimizer state is left as in the last
    checkpoint.

    Args:
        model: a built ``keras.Model`` of the same architecture as the
            checkpoints.
        paths: non-empty list of checkpoint directories (e.g. the last K of
            ``list_checkpoints``).

    Returns:
        ``model``, with the averaged weights.
    """
    paths = list(paths)
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint.")
    sums = None
    for path in paths:
        load_checkpoint(model, path)
        values = [np.asarray(keras.ops.convert_to_numpy(w)) for w in model.weights]
        if sums is None:
            sums = [v.astype("float64") for v in values]
        else:
            for total, value in zip(sums, values, strict=True):
                total += value
    # The last checkpoint is loaded now; replace the float weights by the mean.
    for weight, total in zip(model.weights, sums, strict=True):
        if "float" in keras.backend.standardize_dtype(weight.dtype):
            weight.assign((total / len(paths)).astype(weight.dtype))
    return model


def write_atomic(path, data):
    """Write ``data`` (str as UTF-8, or bytes) so that readers see all or nothing.

    The data goes to a temporary file in the same folder (created if
    missing), which then replaces ``path`` in one ``os.replace``; on failure
    the temporary file is removed and ``path`` is as it was.
    """
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    temp = os.path.join(
        directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp"
    )
    # os.open with 0o666 gives the permissions open() would (less the
    # umask); tempfile.mkstemp's 0o600 would survive the rename.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def write_json_atomic(path, data):
    """Write ``data`` as indented JSON to ``path`` with ``write_atomic``."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_model_atomic(model, path):
    """``model.save(path)`` through a temporary ``.keras`` file and a rename.

    A reader never sees a half-written file at ``path``: it holds either the
    previous model or the new one.
    """
    path = os.fspath(path)
    if not path.endswith(".keras"):
        raise ValueError(f"The path must end with .keras. Received: {path!r}")
    tmp = path[: -len(".keras")] + ".partial.keras"
    model.save(tmp)
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _fsync_dir(path):
    # Makes the renames durable on POSIX; directories cannot be opened on
    # Windows, where there is nothing to do.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
