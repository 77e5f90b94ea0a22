"""The decoding step a search repeats, with and without a key/value cache,
and the loop that runs it while the cache grows (``keras_transformer.search.decoding``
describes the protocol a model offers the searches)."""

import keras
from keras import ops


def _repeated(structure, repeats):
    """Each row of every tensor in ``structure`` repeated ``repeats`` times
    (row b becomes rows b * repeats ... b * repeats + repeats - 1)."""
    if repeats == 1:
        return structure
    return keras.tree.map_structure(lambda x: ops.repeat(x, repeats, axis=0), structure)


def _cached_step(model, source_ids, max_length, repeats):
    """``(step, initial_state, grow)``: next-token logits from a key/value
    cache. The source is encoded, and its cross-attention keys and values
    projected, once per sentence, then repeated for each of its ``repeats``
    hypotheses."""
    encoder_outputs, encoder_mask = model.encode(source_ids)
    self_cache, cross_cache = model.initial_cache(encoder_outputs, max_length)
    self_cache, cross_cache, encoder_mask = _repeated(
        (self_cache, cross_cache, encoder_mask), repeats
    )

    def step(tokens, index, state):
        return model.decode_step(tokens, index, state, cross_cache, encoder_mask)

    return step, self_cache, getattr(model, "grow_cache", None)


def _uncached_step(model, source_ids, max_length, repeats):
    """``(step, initial_state, None)``: next-token logits from the decoder on
    the whole prefix; the state is the decoder input, the prefix then
    padding."""
    encoder_outputs, encoder_mask = _repeated(model.encode(source_ids), repeats)
    rows = ops.shape(encoder_outputs)[0]

    def step(tokens, index, state):
        columns = ops.arange(ops.shape(state)[1])
        state = ops.where(
            ops.equal(columns, index)[None, :],
            ops.cast(tokens, "int32")[:, None],
            state,
        )
        # (B, T, V): position t only sees positions <= t (causal mask).
        logits = model.decode(state, encoder_outputs, encoder_mask)
        return ops.take(logits, index, axis=1), state

    return step, ops.zeros((rows, max_length), "int32"), None


# A cached search starts with a cache this wide and doubles it when a step
# reaches its end: a step reads (and beam search reorders) the whole cache,
# and most sentences end long before the output limit.
FIRST_CACHE_WIDTH = 16


def _stages(max_length, growable):
    """The cache widths a search passes through, ending at ``max_length``."""
    widths = []
    width = FIRST_CACHE_WIDTH
    while growable and width < max_length:
        widths.append(width)
        width *= 2
    return widths + [max_length]


def _search_loop(model, source_ids, max_length, use_cache, repeats, cond, body, start):
    """Run ``body(step, *carry) -> carry`` while ``cond(*carry)``; the step's
    state is the carry's last item. ``carry[0]`` is the step index.

    With a cache the model can grow (``grow_cache``), the loop runs in
    stages of cache width 16, 32, ... up to ``max_length``: each stage ends
    when the search is done or its cache is full, and the next one starts
    from a copy of the cache made wider (once all rows are done it costs
    only that copy)."""
    make = _cached_step if use_cache else _uncached_step
    widths = _stages(max_length, use_cache and hasattr(model, "grow_cache"))
    step, state, grow = make(model, source_ids, widths[0], repeats)
    carry = tuple(start) + (state,)
    for n, width in enumerate(widths):
        if n:
            carry = carry[:-1] + (grow(carry[-1], width),)
        carry = ops.while_loop(
            lambda *c, width=width: ops.logical_and(ops.less(c[0], width), cond(*c)),
            lambda *c: body(step, *c),
            carry,
        )
    return carry
