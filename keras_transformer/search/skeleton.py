"""The one search loop every search runs: a decoding step, the rules of
what it may emit, then a selection rule that keeps the next hypotheses.

What differs between searches is a part handed to the loop, not a copy of
it (the split OpenNMT-py makes between ``DecodeStrategy`` and its scorers,
and fairseq between its generator and its ``Search`` classes):

- the **emission** (``search.emission.Emission``): the ids a step may never
  produce, and the end token forced at a row's limit;
- the **selection** (``search.greedy.Greedy``, ``search.one_beam.OneBeam``,
  ``search.transformers_beam.TwoPools``,
  ``search.constrained.ConstrainedBeam``): which candidates survive a step,
  the length penalty they are ranked with, and when a row is done.

A selection is an object with ``beam_size``, ``start(rows, max_length)``
(its first carry, a tuple of tensors), ``open(carry)`` (a scalar: some row
is still searching), ``select(carry, log_probs, index) -> (carry, parents,
tokens)`` (``parents`` ``(B, K)``, the hypothesis each kept one extends, or
None for a beam of one; ``tokens`` the ids fed to the next step) and
``result(carry)``.
"""

import keras
from keras import ops

from keras_transformer.search.steps import _search_loop


def run_search(
    model, source_ids, max_lengths, max_length, use_cache, emission, selection
):
    """``selection.result`` after the search of ``source_ids`` (the loop is
    ``steps._search_loop``'s, with the cache its model offers)."""
    rows = ops.shape(source_ids)[0]
    k = selection.beam_size
    steps = ops.max(max_lengths)
    # Row b, hypothesis j sits at b * K + j of the decoder's batch.
    row_starts = (ops.arange(rows, dtype="int32") * k)[:, None]

    def cond(index, tokens, carry, state):
        return ops.logical_and(ops.less(index, steps), selection.open(carry))

    def body(step, index, tokens, carry, state):
        logits, state = step(tokens, index, state)
        log_probs = emission(logits, index, max_lengths, k)
        carry, parents, chosen = selection.select(carry, log_probs, index)
        if parents is not None:
            # Each kept hypothesis continues its parent's cache and state.
            flat_parents = ops.reshape(row_starts + ops.cast(parents, "int32"), (-1,))
            state = keras.tree.map_structure(
                lambda x: ops.take(x, flat_parents, axis=0), state
            )
        return index + 1, ops.reshape(chosen, (-1,)), carry, state

    start = (
        ops.convert_to_tensor(0, "int32"),
        ops.full((rows * k,), emission.ids.start, "int32"),
        selection.start(rows, max_length),
    )
    _, _, carry, _ = _search_loop(
        model, source_ids, max_length, use_cache, k, cond, body, start
    )
    return selection.result(carry)


def at_column(columns, index):
    """``(1, T)``: True at the output column of step ``index``."""
    return ops.equal(columns, index)[None, :]


def stops(tokens, index, max_lengths, end_id):
    """True where a token ends its hypothesis: the end token or the length limit."""
    full = ops.greater_equal(index + 1, max_lengths)
    if end_id is None:
        return full
    return ops.logical_or(ops.equal(tokens, end_id), full)
