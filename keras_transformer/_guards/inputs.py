"""The model's inputs and targets checked once per path, with one message each.

Token ids must be integers inside the vocabulary, no longer than
``max_length``, with the same rows in both inputs (and the targets). Where
they are checked depends on where the values are:

- **On the host** (NumPy arrays and Python lists given to ``model(x)``,
  ``fit``, ``evaluate``, ``predict``; each batch a dataset streams into a
  JAX or PyTorch step): ``validate`` before any work, and the call or step
  then runs with the layers' value checks off (``_checks.inputs_checked``).
- **In a TensorFlow graph** (batches streamed into ``fit``/``evaluate``):
  ``graph_checks``, ahead of every op of the step
  (``_fault_safe.checked_tf_step``), the layers' checks off.
- **Where neither can read them** (tensors given to a call, ``predict`` on
  TensorFlow, a step under XLA, global arrays of several JAX processes): the
  layers' own checks (``TokenEmbedding``) and ``checked_targets`` in
  ``compute_loss``.

Decoding checks its source ids on the host (``keras_transformer.search.decoding``)
and runs its compiled loop without checks; a translator checks its texts
(``translate.base.check_texts``) before it tokenizes them.
"""

import numbers

import keras
import numpy as np
from keras import ops

from keras_transformer import backend
from keras_transformer._guards import checks as _checks

INPUT_NAMES = ("encoder_inputs", "decoder_inputs")


def limits(model):
    """{input name: (vocab_size, max_length)} of a ``Transformer``."""
    return {
        "encoder_inputs": (model.src_vocab_size, model.max_length),
        "decoder_inputs": (model.tgt_vocab_size, model.max_length),
    }


def target_pad_ids(model):
    """Target ids that the compiled loss skips: allowed outside the vocabulary."""
    loss = getattr(model, "loss", None)
    losses = loss if isinstance(loss, (list, tuple)) else [loss]
    pads = set()
    for loss in losses:
        for attribute in ("pad_id", "ignore_class"):
            value = getattr(loss, attribute, None)
            if isinstance(value, int) and not isinstance(value, bool):
                pads.add(value)
    return sorted(pads)


def validate(model, x, y=None):
    """Raise ``TypeError``/``ValueError`` for malformed token ids or targets.

    Checks what is known on the host: NumPy arrays, lists and concrete
    tensors. Symbolic and traced values are left to the layers' own checks
    (and to ``compute_loss`` for the targets). Returns True when both inputs
    were NumPy arrays whose ids were checked here.
    """
    check_container(x)
    if not isinstance(x, dict):
        return False  # a dataset, generator or PyDataset: checked per batch
    arrays = _host_arrays(x, y)
    if arrays is None:
        return False
    _check_shapes(arrays)
    bounds = dict(limits(model))
    bounds["targets"] = (model.tgt_vocab_size, None)
    for name, (vocab_size, max_length) in bounds.items():
        if name not in arrays:
            continue
        ids = arrays[name]
        if name == "targets" and "decoder_inputs" in arrays:
            _check_same_shape(arrays["decoder_inputs"], ids)
        if max_length is not None and ids.shape[1] > max_length:
            raise ValueError(
                f"{name} is longer than the model's max_length={max_length}. "
                f"Received: {name}.shape={tuple(ids.shape)}"
            )
        # Ranges of backend tensors are checked by the embedding layers
        # (and compute_loss), without a copy to the host here.
        if not isinstance(ids, np.ndarray):
            continue
        pads = target_pad_ids(model) if name == "targets" else []
        if pads:
            ids = np.where(np.isin(ids, pads), 0, ids)
        check_ids(ids, name, vocab_size, pads)
    return all(isinstance(arrays.get(name), np.ndarray) for name in INPUT_NAMES)


def check_batch(model, data):
    """Check one batch on the host before it enters a compiled step; True
    when it was checked whole (then the step needs no checks of its own)."""
    x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
    if isinstance(x, dict):
        x = {name: to_numpy(value) for name, value in x.items()}
        x = {name: value for name, value in x.items() if value is not None}
        if any(name not in x for name in INPUT_NAMES):
            return False  # not all on this host: the layers check in the step
    target = to_numpy(y)
    checked = validate(model, x, target)
    return checked and (y is None or target is not None)


def to_numpy(value):
    """A host copy of a batch leaf, or None if it is not (fully) on this host."""
    if value is None or isinstance(value, np.ndarray):
        return value
    if getattr(value, "is_fully_addressable", True) is False:
        return None  # a global array of several processes: the layers check it
    try:
        return np.asarray(value)
    except Exception:
        return None


def check_ids(ids, name, vocab_size, pads=()):
    """Raise ``ValueError`` unless every id of the NumPy array ``ids`` is in
    ``[0, vocab_size)`` (or one of ``pads``, mapped to 0 by the caller); the
    message names the input ``name``, if given."""
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        allowed = f"[0, {vocab_size}) (vocab_size={vocab_size})"
        if pads:
            allowed += f" or the loss's pad id {list(pads)}"
        where = f" in {name}" if name else ""
        raise ValueError(
            f"Token ids{where} must be in {allowed}. Received ids from "
            f"{ids.min()} to {ids.max()}."
        )


def checked_targets(model, y):
    """``(y, ids)``: the targets with their range check attached, and the
    ids with the loss's pad ids mapped into the vocabulary (for NaN
    poisoning under XLA); ``(y, None)`` if ``y`` is not one tensor."""
    if y is None or isinstance(y, (dict, list, tuple)):
        return y, None
    vocab_size = model.tgt_vocab_size
    ids = y
    if "float" in keras.backend.standardize_dtype(y.dtype):
        # Keras itself may hand integer labels over as floats (it does
        # under tf.distribute); host data was already held to an integer
        # dtype (validate). What must not pass is a fractional id.
        whole = ops.cast(ops.equal(y, ops.floor(y)), "int32")
        y = _checks.check_range(
            whole,
            1,
            2,
            "targets must hold integer token ids; some have a fractional "
            "part (or are NaN).",
            output=y,
        )
        ids = ops.cast(ops.where(ops.equal(whole, 1), y, -1), "int32")
    else:
        _checks.check_integer(y, "targets")
    for pad in target_pad_ids(model):
        ids = ops.where(ops.equal(ids, pad), 0, ids)
    y = _checks.check_range(
        ids,
        0,
        vocab_size,
        f"Target ids must be in [0, {vocab_size}) (the target vocabulary) "
        "or the loss's pad id. Received ids from {lo} to {hi}.",
        output=y,
    )
    return y, ids


def graph_checks(model, data):
    """In-graph checks of one batch (TensorFlow): tensors that fail to
    compute when the batch is bad (see ``_fault_safe.checked_tf_step``)."""
    x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
    checks = []
    if isinstance(x, dict):
        for name, (vocab_size, max_length) in limits(model).items():
            ids = x.get(name)
            if ids is None or not hasattr(ids, "dtype"):
                continue
            _checks.check_integer(ids, name)
            checks.append(_checks.check_not_empty(ids, name))
            if max_length is not None:
                checks.append(
                    _checks.check_range(
                        ops.reshape(ops.shape(ids)[-1], (1,)),
                        1,
                        max_length + 1,
                        f"{name} is longer than the model's max_length="
                        f"{max_length}. Received length {{hi}}.",
                    )
                )
            checks.append(
                _checks.check_range(
                    ids,
                    0,
                    vocab_size,
                    f"Token ids must be in [0, {vocab_size}) for {name} "
                    f"(vocab_size={vocab_size}). Received ids from {{lo}} "
                    "to {hi}.",
                )
            )
    checked_y, ids = checked_targets(model, y)
    if ids is not None:
        checks.append(checked_y)
    return checks


def check_container(x):
    """Refuse what cannot be the input dict, and a dict short of a key."""
    if isinstance(x, (list, tuple)):
        received = f"a {type(x).__name__} of {len(x)} items"
    elif x is None or isinstance(x, (str, bytes, numbers.Number)):
        received = repr(x)[:40]
    elif hasattr(x, "shape") and hasattr(x, "dtype"):
        received = f"one array of shape {tuple(x.shape)}"
    else:
        received = None  # a dict, or a dataset / generator / PyDataset
    if received is not None:
        raise ValueError(
            f"The model takes a dict with keys {list(INPUT_NAMES)}. "
            f"Received: {received}. Pass "
            "{'encoder_inputs': source_ids, 'decoder_inputs': target_ids}."
        )
    if isinstance(x, dict):
        missing = [name for name in INPUT_NAMES if name not in x]
        if missing:
            raise ValueError(
                f"Missing model inputs {missing}. Expected a dict with keys "
                f"{list(INPUT_NAMES)}. Received keys: {sorted(x)}"
            )


def arrays_from_lists(x, name=None):
    """Python lists of ids as arrays: Keras would read a list as many inputs."""
    if isinstance(x, dict):
        return {
            key: _as_array(value, key) if isinstance(value, (list, tuple)) else value
            for key, value in x.items()
        }
    if name is not None and isinstance(x, (list, tuple)):
        return _as_array(x, name)
    return x


def _host_arrays(x, y):
    """{name: array} of the inputs (and targets) known on the host; None if
    an input is symbolic or traced (then the layers check it)."""
    arrays = {}
    for name in INPUT_NAMES:
        value = x[name]
        if isinstance(value, (list, tuple)):
            value = _as_array(value, name)
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            continue
        if isinstance(value, keras.KerasTensor) or backend.is_traced(value):
            return None
        arrays[name] = value
    if isinstance(y, (list, tuple)):
        y = _as_array(y, "targets")
    if y is not None and hasattr(y, "shape") and hasattr(y, "dtype"):
        if not (isinstance(y, keras.KerasTensor) or backend.is_traced(y)):
            arrays["targets"] = y
    return arrays


def _check_shapes(arrays):
    """Integer ids of shape (batch, length), the same rows, none empty."""
    for name, value in arrays.items():
        _checks.check_integer(value, name)
        if len(value.shape) != 2:
            raise ValueError(
                f"{name} must have shape (batch, length). "
                f"Received: {name}.shape={tuple(value.shape)}"
            )
    rows = {name: int(value.shape[0]) for name, value in arrays.items()}
    if len(set(rows.values())) > 1:
        raise ValueError(
            "All inputs (and targets) must have the same number of rows "
            f"(batch size). Received: {rows}"
        )
    if 0 in rows.values():
        raise ValueError(
            f"The batch has no rows: there is nothing to run. Received: {rows}"
        )
    for name, value in arrays.items():
        if int(value.shape[1]) == 0:
            raise ValueError(
                f"{name} must hold at least one token per sequence. "
                f"Received: {name}.shape={tuple(value.shape)}"
            )


def _as_array(value, name):
    try:
        return np.asarray(value)
    except ValueError as error:
        raise ValueError(
            f"{name} is a ragged list: pad every sequence to one length with "
            "0 (the padding id), or use a NumPy array. "
            f"({error})"
        ) from None


def _check_same_shape(decoder_inputs, targets):
    if tuple(decoder_inputs.shape) != tuple(targets.shape):
        raise ValueError(
            "targets must have the shape of decoder_inputs (one target id per "
            f"decoder position). Received: decoder_inputs.shape="
            f"{tuple(decoder_inputs.shape)}, targets.shape={tuple(targets.shape)}"
        )
