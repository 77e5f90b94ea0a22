"""Batching by length: buckets of similar length, batched to a token budget.

The paper (§5.1): "Sentence pairs were batched together by approximate
sequence length. Each training batch contained a set of sentence pairs
containing approximately 25000 source tokens and 25000 target tokens."

Conventions:

- **Ids.** Token id 0 is padding; ``START_ID`` (1) and ``END_ID`` (2) are
  the reserved ids of ``keras_transformer.data.tokenizer``.
- **Sources** are used as given (typically ``encode(tok, sources)``, which
  ends each one with ``END_ID``) and must not contain 0.
- **Targets** are given *without* start and end ids (``encode(tok, targets,
  add_end=False)``). For a target ``t`` of length ``n``::

      decoder_inputs = [START_ID] + t        (length n + 1)
      labels         = t + [END_ID]          (length n + 1)

  so ``labels[i]`` is the token that follows ``decoder_inputs[i]``, and the
  decoder's padding mask covers exactly the labels that are not padding.
- **Buckets.** An example's length is ``max(len(source), n + 1)``; its bucket
  is the smallest boundary at least that long. Sources, decoder inputs and
  labels of a batch are all padded with 0 to that one bucket length, so a
  bucket gives one sequence length for everything.
- **Batch size.** A bucket of length ``L`` is cut into batches of
  ``rows = batch_tokens // L`` examples, so ``rows · L <= batch_tokens`` per
  input. With ``rows_multiple = k`` the rows are rounded down to a multiple
  of ``k`` (``(batch_tokens // L) // k · k``), so that every batch splits
  evenly over ``k`` data-parallel replicas. A bucket's last, partial batch is
  filled up with all-padding rows (which carry no loss): each bucket then has
  one array shape, and a compiled step (``jax.jit``, XLA) is traced once per
  bucket rather than once per batch.
"""

import numbers

import keras
import numpy as np

from keras_transformer import backend
from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID

# The buckets of a training run: every multiple of 4 from 8 to 32 (short
# sentences, such as the numbers task's 5 to 15 tokens, waste little), then
# about 1.2 times apart.
TRAINING_BUCKETS = {"min_length": 8, "step": 1.2, "multiple": 4, "linear_until": 32}


def _grid(min_length, step, multiple, linear_until):
    """The bucket lengths without end: multiples of ``multiple`` from
    ``min_length``, every one up to ``linear_until``, then each the previous
    one times ``step`` (its integer part rounded up to a multiple)."""
    boundary = -(-min_length // multiple) * multiple
    while True:
        yield boundary
        if boundary < linear_until:
            boundary += multiple
        else:
            boundary = -(-int(boundary * step) // multiple) * multiple


def _check_rule(min_length, step, multiple, linear_until):
    for name, value in (("min_length", min_length), ("multiple", multiple)):
        _check_positive_int(value, name)
    if linear_until is not None:
        _check_positive_int(linear_until, "linear_until")
    if not step > 1:
        raise ValueError(f"step must be > 1. Received: step={step!r}")
    return _grid(min_length, step, multiple, linear_until or 0)


def bucket_boundaries(
    max_length, min_length=8, step=1.25, multiple=8, linear_until=None
):
    """Padded lengths growing from ``min_length`` to ``max_length``.

    The one rule for bucket lengths (training batches and the translator's
    compiled shapes): multiples of ``multiple`` from ``min_length``, every
    one up to ``linear_until``, then each about ``step`` times the last; the
    last boundary is ``max_length`` itself (the longest sequence kept). With
    a ratio ``step`` between neighbours no example is padded by more than
    about ``1 - 1/step`` of its bucket (20 % for 1.25).

    Args:
        max_length: int, the largest padded length (e.g. the model's
            ``max_length``).
        min_length: int, the smallest boundary (rounded up to ``multiple``).
        step: float > 1, growth factor between neighbouring boundaries.
        multiple: int, boundaries below ``max_length`` are multiples of it.
        linear_until: optional int, every multiple up to this length.

    Returns:
        Sorted list of distinct ints, ending with ``max_length``. E.g.
        ``bucket_boundaries(128)`` is ``[8, 16, 24, 32, 40, 56, 72, 96, 120,
        128]``; ``bucket_boundaries(128, **TRAINING_BUCKETS)`` is ``[8, 12,
        16, 20, 24, 28, 32, 40, 48, 60, 72, 88, 108, 128]``.
    """
    _check_positive_int(max_length, "max_length")
    boundaries = []
    for boundary in _check_rule(min_length, step, multiple, linear_until):
        if boundary >= max_length:
            return boundaries + [int(max_length)]
        boundaries.append(boundary)


def bucket_length(
    length, max_length=None, min_length=8, step=1.25, multiple=8, linear_until=None
):
    """The bucket of a sequence of ``length``: the smallest length of
    ``bucket_boundaries``' rule (the same arguments) that holds it, at most
    ``max_length`` (None: no end)."""
    for boundary in _check_rule(min_length, step, multiple, linear_until):
        if boundary >= length:
            return boundary if max_length is None else min(boundary, max_length)


def make_batches(
    src_ids,
    tgt_ids,
    batch_tokens,
    boundaries,
    shuffle=True,
    seed=0,
    drop_longer=True,
    rows_multiple=1,
):
    """Bucket, batch and pad a parallel corpus of token ids (one epoch).

    See the module docstring for the conventions (targets without start/end
    ids, one padded length per bucket, padding rows in a bucket's last batch).

    Args:
        src_ids: list of source id lists.
        tgt_ids: list of target id lists, without ``START_ID``/``END_ID``.
        batch_tokens: int, the most rows × padded length per batch; at least
            the largest boundary, so that every bucket fits one row.
        boundaries: sorted bucket lengths, e.g. from ``bucket_boundaries``.
        shuffle: shuffle examples within each bucket and the order of the
            batches; otherwise input order within buckets, buckets shortest
            first. Either way the first two batches are one of the shortest
            and one of the longest bucket (see ``BucketedDataset``).
        seed: int or sequence of ints for ``np.random.default_rng``.
        drop_longer: drop examples longer than the largest boundary;
            otherwise raise ``ValueError``.
        rows_multiple: int, every batch's rows are a multiple of it (e.g. the
            number of data-parallel replicas, so each gets an equal share).

    Returns:
        ``(batches, dropped)``: ``batches`` is a list of ``(inputs, labels)``
        with ``inputs = {"encoder_inputs": ..., "decoder_inputs": ...}``, all
        three int32 arrays of shape ``(rows, bucket_length)``; ``dropped`` is
        the sorted list of the indices of examples that were too long.

    Raises:
        ValueError: for malformed ids or boundaries, examples too long (with
            ``drop_longer=False``), or a ``batch_tokens`` too small for one
            row (``rows_multiple`` rows) at the largest boundary.
        TypeError: if ``batch_tokens`` or ``rows_multiple`` is not an int.
    """
    plan = _BucketPlan(
        src_ids, tgt_ids, batch_tokens, boundaries, drop_longer, rows_multiple
    )
    rng = np.random.default_rng(seed) if shuffle else None
    return [plan.batch(entry) for entry in plan.epoch(rng)], plan.dropped


class _FixedOrder(keras.utils.PyDataset):
    """Batches of a ``_BucketPlan`` in a given order: ``epoch_view`` returns
    one as is; ``BucketedDataset`` redraws its order at every epoch end."""

    def __init__(self, plan, order, process_shard=(0, 1), **kwargs):
        super().__init__(**kwargs)
        self._plan = plan
        self._order = order
        self.process_shard = _check_shard(process_shard, plan.rows_multiple)

    def __len__(self):
        return len(self._order)

    def __getitem__(self, index):
        if not 0 <= index < len(self._order):
            raise IndexError(f"Batch index {index} out of range [0, {len(self)}).")
        inputs, labels = self._plan.batch(self._order[index])
        shard, shards = self.process_shard
        if shards == 1:
            return inputs, labels
        # This process's rows of the global batch (rows_multiple makes every
        # batch split evenly): Keras joins the processes' shares, in process
        # order, into the batch that the one jitted step sees.
        rows = len(labels) // shards
        part = slice(shard * rows, (shard + 1) * rows)
        return {k: v[part] for k, v in inputs.items()}, labels[part]

    def target_tokens(self, index):
        """Target tokens (END included, padding not) of batch ``index``."""
        _, members = self._order[index]
        lengths = getattr(self._plan.tgt, "lengths", None)
        if lengths is not None:
            return int(lengths[members].sum()) + len(members)
        return sum(len(self._plan.tgt[example]) + 1 for example in members)


class BucketedDataset(_FixedOrder):
    """``make_batches`` as a ``keras.utils.PyDataset`` for ``model.fit``.

    Every call of ``on_epoch_end`` draws a new order (examples within buckets,
    then batches) from ``np.random.default_rng([seed, epoch])``, so epochs
    differ and a run is repeatable. (Keras 3.15 calls ``on_epoch_end`` once
    when ``fit`` starts and once after each epoch, so the first epoch of a
    ``fit`` is served in the order of ``epoch=1``.) The number of batches is
    the same every epoch. Keras' ``fit(shuffle=True)`` (its default) permutes
    the batch order once more with Python's ``random``; pass
    ``shuffle=False`` to ``fit`` to keep exactly this order.

    The first two batches of every epoch are one of the shortest bucket and
    one of the longest (also in ``make_batches``), from which the TensorFlow
    backend fixes the input signature (``_shortest_and_longest_first``).

    Args:
        src_ids, tgt_ids, batch_tokens, boundaries, drop_longer,
            rows_multiple: as for ``make_batches``; or ``src_ids`` and
            ``tgt_ids`` are an ``IdStore``'s ``source`` and ``target``
            (corpora larger than memory: the ids stay on disk).
        process_shard: ``(i, n)``: serve only the ``i``-th of ``n`` equal
            row blocks of every batch, for process ``i`` of ``n`` training
            one model (multi-process data parallel). ``rows_multiple`` must
            be a multiple of ``n``. The batches, their order and
            ``target_tokens`` stay those of the whole batch.
        shuffle: reshuffle every epoch (False: the fixed order of
            ``make_batches(shuffle=False)``, e.g. for validation data).
        seed: int seed.
        **kwargs: ``workers``, ``use_multiprocessing``, ``max_queue_size`` for
            ``keras.utils.PyDataset``.

    Attributes:
        dropped: indices of the examples too long for the largest boundary.
        epoch: how many times the order was redrawn (the seed of the order
            being served, with ``seed``); starts at 0.
    """

    def __init__(
        self,
        src_ids,
        tgt_ids,
        batch_tokens,
        boundaries,
        shuffle=True,
        seed=0,
        drop_longer=True,
        rows_multiple=1,
        process_shard=(0, 1),
        **kwargs,
    ):
        plan = _BucketPlan(
            src_ids, tgt_ids, batch_tokens, boundaries, drop_longer, rows_multiple
        )
        self.dropped = plan.dropped
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        super().__init__(plan, None, process_shard, **kwargs)
        self._order = self._epoch_order(self.epoch)

    def _epoch_order(self, epoch):
        rng = np.random.default_rng([self.seed, int(epoch)]) if self.shuffle else None
        return self._plan.epoch(rng)

    def on_epoch_end(self):
        self.epoch += 1
        self._order = self._epoch_order(self.epoch)

    def epoch_view(self, epoch, skip=0):
        """The batches of epoch ``epoch`` in a fixed order, without the first ``skip``.

        For training loops that call ``fit`` once per epoch and resume in the
        middle of one: epoch ``e`` always has the order drawn from
        ``np.random.default_rng([seed, e])`` (or the fixed order without
        shuffling), whatever happened before, and ``skip`` leaves out the
        batches already trained. On the TensorFlow backend the remaining
        batches start with one of the shortest and one of the longest bucket
        (see the class docstring); elsewhere their order is kept.

        Args:
            epoch: int >= 0.
            skip: int in ``[0, len(self)]``, batches to leave out.

        Returns:
            A ``keras.utils.PyDataset`` with ``len(self) - skip`` batches whose
            ``on_epoch_end`` changes nothing.
        """
        if not 0 <= skip <= len(self):
            raise ValueError(f"skip must be in [0, {len(self)}]. Received: {skip}")
        order = self._epoch_order(epoch)[skip:]
        if skip and backend.fixes_input_signature_from_first_batches():
            order = _shortest_and_longest_first(order)
        return _FixedOrder(self._plan, order, self.process_shard)


def padding_fraction(batches):
    """Share of padding (id 0) among all encoder and decoder input positions.

    Args:
        batches: iterable of ``(inputs, labels)`` as made by ``make_batches``
            or a ``BucketedDataset``.

    Returns:
        float in ``[0, 1]``; 0.0 for no batches.
    """
    padding = total = 0
    for inputs, _ in batches:
        for name in ("encoder_inputs", "decoder_inputs"):
            array = np.asarray(inputs[name])
            padding += int(np.count_nonzero(array == PAD_ID))
            total += array.size
    return padding / total if total else 0.0


def _check_positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int. Received: {name}={value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1. Received: {name}={value!r}")


def _check_shard(process_shard, rows_multiple):
    try:
        shard, shards = (int(v) for v in process_shard)
    except (TypeError, ValueError):
        raise TypeError(
            f"process_shard must be a pair of ints (i, n). Received: {process_shard!r}"
        ) from None
    if not 0 <= shard < shards:
        raise ValueError(
            f"process_shard (i, n) needs 0 <= i < n. Received: {process_shard!r}"
        )
    if rows_multiple % shards:
        raise ValueError(
            f"rows_multiple ({rows_multiple}) must be a multiple of the number of "
            f"process shards ({shards}), so that every batch splits evenly."
        )
    return shard, shards


def _id_lists(rows, name):
    """Lists of Python ints, one per example (accepts arrays of any int dtype)."""
    if isinstance(rows, (str, bytes)):
        raise TypeError(f"{name} must be a list of id lists.")
    return [[int(i) for i in np.asarray(row).reshape(-1).tolist()] for row in rows]


def _shortest_and_longest_first(order):
    """Move a batch of the shortest and one of the longest bucket to the front.

    Keras' TensorFlow backend fixes a ``PyDataset``'s input signature from its
    first two batches. Rows (``batch_tokens // length``, rounded down to a
    multiple of ``rows_multiple``) never grow with the length, so these two
    batches differ in every dimension that differs between any two batches,
    and the signature leaves exactly those open. Otherwise two batches of one
    bucket fix the length, and the first batch of another bucket fails with
    a shape error.
    """
    lengths = [length for length, _ in order]
    if len(set(lengths)) < 2:
        return order
    first = lengths.index(min(lengths))
    second = lengths.index(max(lengths))
    rest = [entry for i, entry in enumerate(order) if i not in (first, second)]
    return [order[first], order[second], *rest]


class _BucketPlan:
    """The examples, sorted into buckets once; orders and arrays per epoch."""

    def __init__(
        self, src_ids, tgt_ids, batch_tokens, boundaries, drop_longer, rows_multiple=1
    ):
        stored = hasattr(src_ids, "lengths") and hasattr(tgt_ids, "lengths")
        if stored:
            # An IdStore's sides (checked when it was written): kept on disk,
            # their lengths read from its index.
            self.src, self.tgt = src_ids, tgt_ids
        else:
            self.src = _id_lists(src_ids, "src_ids")
            self.tgt = _id_lists(tgt_ids, "tgt_ids")
        if len(self.src) != len(self.tgt):
            raise ValueError(
                "src_ids and tgt_ids must hold the same number of examples. "
                f"Received: {len(self.src)} and {len(self.tgt)}"
            )
        if not stored:
            self._check_ids()
        boundaries = [int(b) for b in boundaries]
        if not boundaries or boundaries != sorted(set(boundaries)):
            raise ValueError(
                "boundaries must be a non-empty, strictly increasing list. "
                f"Received: {boundaries}"
            )
        _check_positive_int(boundaries[0], "the smallest boundary")
        _check_positive_int(batch_tokens, "batch_tokens")
        _check_positive_int(rows_multiple, "rows_multiple")
        self.rows_multiple = int(rows_multiple)
        if batch_tokens < boundaries[-1]:
            raise ValueError(
                f"batch_tokens ({batch_tokens}) must be at least the largest "
                f"boundary ({boundaries[-1]}), so that every batch has a row."
            )
        self.rows = {
            length: (batch_tokens // length) // rows_multiple * rows_multiple
            for length in boundaries
        }
        # Rows never grow with the length, so the largest boundary decides;
        # checked whether or not the data reach it, like the one above.
        if self.rows[boundaries[-1]] == 0:
            raise ValueError(
                f"batch_tokens={batch_tokens} is too small for "
                f"rows_multiple={rows_multiple} replicas at bucket length "
                f"{boundaries[-1]}: one row per replica needs batch_tokens >= "
                f"{rows_multiple * boundaries[-1]}."
            )
        if stored:
            lengths = np.maximum(self.src.lengths, self.tgt.lengths + 1)
        else:
            pairs = zip(self.src, self.tgt, strict=True)
            lengths = np.array([max(len(s), len(t) + 1) for s, t in pairs], np.int64)
        # Smallest boundary >= length; len(boundaries) means too long.
        bucket = np.searchsorted(boundaries, lengths, side="left")
        too_long = np.flatnonzero(bucket == len(boundaries))
        if too_long.size and not drop_longer:
            raise ValueError(
                f"{too_long.size} examples are longer than the largest boundary "
                f"({boundaries[-1]}), e.g. example {int(too_long[0])} of length "
                f"{int(lengths[too_long[0]])}. Pass drop_longer=True to drop them."
            )
        self.dropped = too_long.tolist()
        # {bucket length: example indices in input order}, shortest first.
        self.buckets = {
            boundaries[b]: np.flatnonzero(bucket == b)
            for b in range(len(boundaries))
            if np.any(bucket == b)
        }

    def _check_ids(self):
        for name, rows, banned in (
            ("src_ids", self.src, (PAD_ID,)),
            ("tgt_ids", self.tgt, (PAD_ID, START_ID, END_ID)),
        ):
            for index, row in enumerate(rows):
                bad = set(row).intersection(banned)
                if bad or (row and min(row) < 0):
                    raise ValueError(
                        f"{name}[{index}] holds id(s) {sorted(bad) or min(row)}, "
                        f"which {name} may not contain ({_ID_RULES[name]}). "
                        f"Received: {row}"
                    )

    def epoch(self, rng=None):
        """Batches of one epoch as ``(bucket length, example indices)``.

        With ``rng``: examples shuffled within buckets, batches shuffled
        across buckets. Without: input order, buckets shortest first. Either
        way a batch of the shortest and one of the longest bucket come first
        (see ``_shortest_and_longest_first``).
        """
        order = []
        for length, members in self.buckets.items():
            if rng is not None:
                members = rng.permutation(members)
            rows = self.rows[length]
            order += [
                (length, members[i : i + rows]) for i in range(0, len(members), rows)
            ]
        if rng is not None:
            order = [order[i] for i in rng.permutation(len(order))]
        return _shortest_and_longest_first(order)

    def batch(self, entry):
        """The padded arrays of one ``(bucket length, example indices)``."""
        length, members = entry
        rows = self.rows[length]
        # Rows past len(members) stay all padding (the partial last batch).
        encoder = np.zeros((rows, length), dtype="int32")
        decoder = np.zeros((rows, length), dtype="int32")
        labels = np.zeros((rows, length), dtype="int32")
        decoder[: len(members), 0] = START_ID
        for row, example in enumerate(members):
            src, tgt = self.src[example], self.tgt[example]
            encoder[row, : len(src)] = src
            decoder[row, 1 : len(tgt) + 1] = tgt
            labels[row, : len(tgt)] = tgt
            labels[row, len(tgt)] = END_ID
        return {"encoder_inputs": encoder, "decoder_inputs": decoder}, labels


_ID_RULES = {
    "src_ids": "0 is padding",
    "tgt_ids": "0 is padding; start and end ids are added by the batcher",
}
