"""Training checkpoints written atomically, resumed, and averaged.

A checkpoint is a directory ``step-<iterations>`` holding the model's weights
with the optimizer's state (``model.weights.h5``, from ``model.save_weights``)
and ``state.json`` (epoch, batch within the epoch, optimizer iterations,
seconds trained). It is written under a temporary name and renamed when
complete, so a run killed at any moment (``kill -9`` included) leaves either
the previous checkpoints or the new one, never half of one: directories
whose names start with ``.tmp-`` are leftovers of an interrupted write and
are ignored (``remove_temporaries`` clears them).

A checkpoint that was complete once can still be damaged later (a disk
error, a file truncated by a copy): ``load_checkpoint`` then raises
``CheckpointError`` naming the folder and why, and ``load_latest`` and
``average_checkpoints`` can skip such checkpoints instead of failing.

Checkpoint averaging (§6.1: "we used a single model obtained by averaging the
last 5 checkpoints, which were written at 10-minute intervals"; the last 20
for the big models) is ``average_checkpoints``.
"""

import json
import os
import re
import shutil
import uuid

import keras
import numpy as np

from keras_transformer.atomic import (  # noqa: F401 (this module's API too)
    DiskFullError,
    ensure_room,
    fsync_dir,
    full_disk,
    is_disk_full,
    save_model_atomic,
    temporary_target,
    variable_bytes,
    write_atomic,
    write_json_atomic,
)
from keras_transformer.distribute import cluster

WEIGHTS_FILE = "model.weights.h5"
STATE_FILE = "state.json"
_PREFIX = "step-"
_TMP_PREFIX = ".tmp-"
# h5py raises OSError or RuntimeError for a damaged file, Keras ValueError or
# KeyError for one that holds other variables than the model's.
_LOAD_ERRORS = (OSError, RuntimeError, ValueError, KeyError)


class CheckpointError(ValueError):
    """A checkpoint folder that does not load; the message names it and why.

    Attributes:
        path: str, the checkpoint folder.
        reason: str, one line.
    """

    def __init__(self, path, reason):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def checkpoint_name(iterations):
    """Directory name of the checkpoint after ``iterations`` optimizer steps."""
    return f"{_PREFIX}{int(iterations):09d}"


def list_checkpoints(directory, up_to=None):
    """Complete checkpoint directories under ``directory``, oldest first.

    Complete means both files are there; whether they load is for
    ``load_checkpoint`` to find out.

    Args:
        directory: str or path; need not exist.
        up_to: optional int, leave out checkpoints of more optimizer steps.

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
            step = int(name[len(_PREFIX) :])
            if up_to is None or step <= up_to:
                found.append((step, path))
    return [path for _, path in sorted(found)]


def read_state(path):
    """The ``state.json`` dict of the checkpoint directory ``path``.

    Raises:
        CheckpointError: the file is missing, unreadable or not a JSON object.
    """
    try:
        with open(os.path.join(path, STATE_FILE), encoding="utf-8") as file:
            state = json.load(file)
    except (OSError, ValueError) as error:
        raise CheckpointError(path, _why(STATE_FILE, error)) from None
    if not isinstance(state, dict):
        raise CheckpointError(path, f"{STATE_FILE} holds no JSON object")
    return state


def save_checkpoint(model, directory, state, keep=None):
    """Write one checkpoint atomically; optionally keep only the newest ones.

    The checkpoint is written under a temporary name of its own
    (``.tmp-<process>-<random>-step-N``) and renamed into place; whatever
    stops the write (an error, a full disk) removes that temporary folder,
    and other writers' temporaries are left alone (``remove_temporaries``
    clears them for a folder's only writer).

    Args:
        model: a built (usually compiled) ``keras.Model``.
        directory: the checkpoints folder (created if missing).
        state: JSON-serialisable dict; ``state["iterations"]`` (int) names
            the checkpoint.
        keep: optional int >= 1, how many checkpoints to keep (oldest are
            deleted after the new one is in place); None keeps all.

    Returns:
        The path of the new checkpoint directory.

    Raises:
        DiskFullError: not enough room, checked before writing from the
            weights' size (or the newest checkpoint's), or found while
            writing; nothing of the new checkpoint is left.
    """
    os.makedirs(directory, exist_ok=True)
    name = checkpoint_name(state["iterations"])
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, f"{_TMP_PREFIX}{_writer()}-{name}")
    needed = _checkpoint_bytes(model, directory)
    ensure_room("checkpoint", final, needed)
    try:
        os.makedirs(tmp)
        # One process may save while others train (multi-process data
        # parallel): nothing Keras creates while saving may be placed across
        # processes.
        with cluster.without_distribution():
            model.save_weights(os.path.join(tmp, WEIGHTS_FILE))
        write_json_atomic(os.path.join(tmp, STATE_FILE), state, "checkpoint")
        fsync_dir(tmp)
        _rename_into_place(tmp, final)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        full = full_disk(error, "checkpoint", final, needed)
        if full is not None:
            raise full from error
        raise
    fsync_dir(directory)
    if keep is not None:
        # Checkpoints of later steps are left alone: after resuming from an
        # older checkpoint (the later ones did not load) they must not count
        # against the good ones written now; each is replaced when training
        # gets back to its step.
        for old in list_checkpoints(directory, up_to=state["iterations"])[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _rename_into_place(tmp, final):
    if not os.path.exists(final):
        os.rename(tmp, final)
        return
    # The same step saved again (e.g. an epoch ends exactly at a periodic
    # save): the new copy replaces it in two renames.
    old = os.path.join(
        os.path.dirname(final),
        f"{_TMP_PREFIX}{_writer()}-old-{os.path.basename(final)}",
    )
    os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def _writer():
    """This write's own name part: the process and a random tag."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _checkpoint_bytes(model, directory):
    """About what a checkpoint of ``model`` takes: the newest one's size, or
    the weights and the optimizer's state, with room for HDF5's own data."""
    newest = list_checkpoints(directory)[-1:]
    if newest:
        return os.path.getsize(os.path.join(newest[0], WEIGHTS_FILE)) + (1 << 16)
    optimizer = getattr(model, "optimizer", None)
    variables = list(model.weights) + list(getattr(optimizer, "variables", []))
    return int(variable_bytes(variables) * 1.1) + (1 << 18)


def remove_temporaries(directory):
    """Remove every temporary folder a checkpoint write left in
    ``directory``: for the folder's only writer, to whom they are all stale
    (a killed run's, or a full disk's)."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if name.startswith(_TMP_PREFIX):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def load_checkpoint(model, path, finite=False):
    """Restore weights (and the optimizer's state, if compiled); return state.

    The optimizer must be built before its variables can be assigned, so it
    is built here from the model's trainable variables when needed.

    Args:
        finite: also refuse a checkpoint whose weights are not all finite
            (a diverged run's).

    Raises:
        CheckpointError: a file of the checkpoint is missing or damaged,
            holds other variables than ``model``'s, or (``finite``) NaN or
            infinite weights. Some of ``model``'s variables may have been
            assigned already; loading another checkpoint assigns them all
            again.
    """
    state = read_state(path)  # the cheap check first
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    try:
        model.load_weights(os.path.join(path, WEIGHTS_FILE))
    except _LOAD_ERRORS as error:
        raise CheckpointError(path, _why(WEIGHTS_FILE, error)) from None
    if finite and not weights_are_finite(model):
        raise CheckpointError(path, _NOT_FINITE)
    return state


_NOT_FINITE = f"{WEIGHTS_FILE} holds weights that are not finite (NaN or inf)"


def weights_are_finite(model, values=None):
    """Whether every float weight of ``model`` (or ``values``, its weights
    as arrays) is finite."""
    if values is None:
        values = [keras.ops.convert_to_numpy(w) for w in model.weights]
    # Float weights as average_checkpoints picks them: by the variable's
    # dtype, bfloat16 included (not a NumPy floating type).
    return all(
        np.isfinite(np.asarray(value, "float32")).all()
        for weight, value in zip(model.weights, values, strict=True)
        if _is_float(weight)
    )


def _is_float(weight):
    return "float" in keras.backend.standardize_dtype(weight.dtype)


def load_latest(model, directory, on_skip=None, finite=False):
    """Restore the newest checkpoint under ``directory`` that loads.

    Args:
        model: as for ``load_checkpoint``.
        directory: the checkpoints folder; need not exist.
        on_skip: optional callable, given the ``CheckpointError`` of each
            newer checkpoint that did not load.
        finite: skip checkpoints whose weights are not all finite.

    Returns:
        ``(path, state)`` of the checkpoint restored, or ``(None, None)`` when
        none loads (or there is none). After ``(None, None)`` with skipped
        checkpoints, ``model``'s variables may be partly assigned.
    """
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, load_checkpoint(model, path, finite)
        except CheckpointError as error:
            if on_skip is not None:
                on_skip(error)
    return None, None


def average_checkpoints(model, paths, on_skip=None):
    """Set ``model``'s weights to the mean of the weights in ``paths`` (§6.1).

    The mean is taken in float64 per variable over the model weights only
    (not the optimizer's moments); integer variables, if any, are taken from
    the last checkpoint. ``model``'s optimizer state is left as in the last
    checkpoint. A checkpoint with weights that are not finite counts as one
    that does not load: nothing non-finite is averaged in.

    Args:
        model: a built ``keras.Model`` of the same architecture as the
            checkpoints.
        paths: non-empty list of checkpoint directories (e.g. the last K of
            ``list_checkpoints``).
        on_skip: optional callable. Given, a checkpoint that does not load is
            left out of the mean (and "the last checkpoint" above is the last
            one that loads) and its ``CheckpointError`` passed to
            ``on_skip``; otherwise the error is raised.

    Returns:
        ``model``, with the averaged weights.

    Raises:
        CheckpointError: a checkpoint does not load and there is no
            ``on_skip``, or none of them loads.
    """
    paths = list(paths)
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint.")
    sums, used, loaded = None, [], None
    for path in paths:
        try:
            load_checkpoint(model, path)
        except CheckpointError as error:
            if on_skip is None:
                raise
            on_skip(error)
            loaded = None
            continue
        values = [np.asarray(keras.ops.convert_to_numpy(w)) for w in model.weights]
        if not weights_are_finite(model, values):
            if on_skip is None:
                raise CheckpointError(path, _NOT_FINITE)
            on_skip(CheckpointError(path, _NOT_FINITE))
            loaded = None
            continue
        loaded = path
        used.append(path)
        if sums is None:
            sums = [v.astype("float64") for v in values]
        else:
            for total, value in zip(sums, values, strict=True):
                total += value
    if not used:
        names = ", ".join(os.path.basename(os.path.normpath(p)) for p in paths)
        raise CheckpointError(
            os.path.dirname(os.path.normpath(paths[-1])),
            f"no checkpoint of {names} loads",
        )
    if loaded is None:
        # A failed load can leave variables half assigned: back to the last
        # good checkpoint, for the integer weights and the optimizer's state.
        load_checkpoint(model, used[-1])
    # The last checkpoint is loaded now; replace the float weights by the mean.
    for weight, total in zip(model.weights, sums, strict=True):
        if _is_float(weight):
            weight.assign((total / len(used)).astype(weight.dtype))
    return model


def foreign_files(directory):
    """Paths under the checkpoints folder ``directory`` not from ``save_checkpoint``.

    For a caller about to delete the folder, so that nothing else goes with
    it: checkpoint folders (complete, or left by an interrupted save) may
    hold only the weights, the state and a temporary state file.

    Returns:
        sorted list of paths relative to ``directory``, with ``/``.
    """
    # step-N, and the temporary folder of a save that was killed:
    # .tmp-<pid>-<tag>-[old-]step-N (.tmp-[old-]step-N from older versions).
    pattern = (
        f"({re.escape(_TMP_PREFIX)}([0-9]+-[0-9a-f]+-)?(old-)?)?"
        f"{re.escape(_PREFIX)}[0-9]+"
    )
    found = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        ours = re.fullmatch(pattern, name)
        if not ours or os.path.islink(path) or not os.path.isdir(path):
            found.append(name)
            continue
        for inner in sorted(os.listdir(path)):
            inner_path = os.path.join(path, inner)
            known = inner in (WEIGHTS_FILE, STATE_FILE) or (
                temporary_target(inner) == STATE_FILE
            )
            if os.path.islink(inner_path) or not os.path.isfile(inner_path):
                known = False
            if not known:
                found.append(f"{name}/{inner}")
    return found


def _why(file, error):
    # One line: Keras' own messages run over several, with blank ones.
    text = " ".join(str(error).split()) or "no message"
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{file} does not load ({type(error).__name__}: {text})"
