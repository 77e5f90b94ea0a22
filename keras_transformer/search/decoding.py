"""Greedy and beam search for the encoder-decoder, with a key/value cache.

Both searches run as one compiled loop per input shape: ``jax.jit`` around
``jax.lax.while_loop`` on JAX, ``tf.function(jit_compile=True)`` (XLA) on
TensorFlow, and an eager loop under ``torch.no_grad()`` on PyTorch. Callers
pad sources and output lengths to a few bucket sizes (``Translator`` does)
so that a new input length does not mean a new compilation.

The search knows the model only through its public methods, so any model
that has them can be searched:

- ``encode(source_ids) -> (encoder_outputs, encoder_mask)``;
- cached (``use_cache=True``, the default):
  ``initial_cache(encoder_outputs, max_length) -> (self_cache, cross_cache)``
  and ``decode_step(token_ids, index, self_cache, cross_cache, encoder_mask)
  -> (logits, self_cache)``: the source is encoded once, each decoder layer's
  cross-attention keys and values are projected once, and each
  self-attention layer keeps the keys and values of the tokens generated so
  far, so a step runs the decoder on one position;
- optionally ``grow_cache(self_cache, max_length) -> self_cache``: the cache
  made wider. With it a cached search starts with a cache 16 positions wide
  and doubles it as the output grows, so a step reads (and beam search
  reorders) what the sentences need, not the whole output limit;
- uncached: ``decode(prefix, encoder_outputs, encoder_mask) -> logits``, the
  decoder on the whole prefix at every step, as in training. It is there to
  check the cached path against, and the tests check that both give the
  same tokens.

The special ids (``start_id``, ``end_id``, ``pad_id``) are arguments;
``Translator`` passes its tokenizer's.

Beam search (the paper, §6.1: "beam search with a beam size of 4 and length
penalty α = 0.6") keeps ``beam_size`` hypotheses per input. A hypothesis that
has produced the end token is finished: it stays in the beam with its score
and competes with the unfinished ones. At each step every unfinished
hypothesis is extended by every token, each finished one is carried over
unchanged, and the ``beam_size`` best of all these candidates are kept, by
``log P(Y | X) / lp(Y)`` with the length penalty of Wu et al. (2016),
``lp(Y) = ((5 + |Y|) / 6) ** α`` (|Y| counts the end token). An input is done
when its whole beam is finished, or, with ``top_n``, as soon as its ``top_n``
best are finished and no unfinished hypothesis can overtake them (a bound:
log P only falls, and lp is largest at the output limit); ``translate``
needs only the best. Each source is encoded once and its hypotheses share
the encoder output. Keeping finished hypotheses in the beam makes
``beam_size=1`` exactly greedy search. keras-hub's ``BeamSampler`` is not used:
it has no length penalty and no finished hypotheses (it always runs to the
maximum length and ranks by the raw log-probability).

The pad and start ids are never generated: neither occurs inside a target
sentence.

``beam_search(..., length_penalty_form="transformers")`` runs Hugging Face
transformers' beam search instead (``transformers_beam.py``), for models
imported from checkpoints that expect it.
"""

import collections
import contextlib
import threading

import keras
import numpy as np
from keras import ops

from keras_transformer import backend
from keras_transformer._guards import checks as _checks
from keras_transformer._guards import inputs as _inputs
from keras_transformer.search.options import (
    BEAM_SIZE,
    LENGTH_PENALTY,
    check_beam_size,
    check_length_penalty,
    check_length_penalty_form,
    length_penalty,
)
from keras_transformer.search.steps import _search_loop
from keras_transformer.search.transformers_beam import transformers_beam_loop
from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID

# Log-probability of an impossible candidate. Finite, so that arithmetic on it
# (sums, divisions by the length penalty) never makes a NaN.
IMPOSSIBLE = -1e30
_COMPILE_LOCK = threading.Lock()


# -- one decoding step ---------------------------------------------------------------


def _log_probs(logits, ids, last=None):
    """Log-softmax over the vocabulary with pad and start made impossible, and
    every token but the end one where ``last`` (rows at their last step,
    when the end token is forced there)."""
    vocab = ops.arange(ops.shape(logits)[-1])
    banned = ops.logical_or(ops.equal(vocab, ids.pad), ops.equal(vocab, ids.start))
    if last is not None:
        banned = ops.logical_or(
            banned, ops.logical_and(last[:, None], ops.not_equal(vocab, ids.end))
        )
    logits = ops.where(banned, IMPOSSIBLE, logits)
    return ops.log_softmax(logits, axis=-1)


def _at_column(columns, index):
    return ops.equal(columns, index)[None, :]


def _stops(tokens, index, max_lengths, end_id):
    """True where a token ends its hypothesis: the end token or the length limit."""
    full = ops.greater_equal(index + 1, max_lengths)
    if end_id is None:
        return full
    return ops.logical_or(ops.equal(tokens, end_id), full)


# -- the two searches, as functions of tensors -------------------------------------


def greedy_loop(
    model, source_ids, max_lengths, max_length, use_cache, ids, forced_end=False
):
    """``greedy_search``'s ops without its host-side checks (what graphs trace)."""
    rows = ops.shape(source_ids)[0]
    columns = ops.arange(max_length)
    steps = ops.max(max_lengths)

    def cond(index, tokens, output, scores, done, state):
        return ops.logical_and(ops.less(index, steps), ops.logical_not(ops.all(done)))

    def body(step, index, tokens, output, scores, done, state):
        logits, state = step(tokens, index, state)
        last = ops.greater_equal(index + 1, max_lengths) if forced_end else None
        log_probs = _log_probs(logits, ids, last)
        chosen = ops.cast(ops.argmax(log_probs, axis=-1), "int32")
        chosen = ops.where(done, ids.pad, chosen)
        gain = ops.take_along_axis(log_probs, chosen[:, None], axis=1)[:, 0]
        scores = scores + ops.where(done, 0.0, gain)
        output = ops.where(_at_column(columns, index), chosen[:, None], output)
        done = ops.logical_or(done, _stops(chosen, index, max_lengths, ids.end))
        return index + 1, chosen, output, scores, done, state

    start = (
        ops.convert_to_tensor(0, "int32"),
        ops.full((rows,), ids.start, "int32"),
        ops.full((rows, max_length), ids.pad, "int32"),
        ops.zeros((rows,), "float32"),
        ops.less_equal(max_lengths, 0),
    )
    _, _, output, scores, _, _ = _search_loop(
        model, source_ids, max_length, use_cache, 1, cond, body, start
    )
    return output, scores


def _settled(log_probs, lengths, finished, top_n, final_penalty, alpha):
    """``(B,)``: True where an input's ``top_n`` best hypotheses (the beam is
    best first) are finished and no unfinished one can ever outrank them:
    its log P only falls with each token, and its length penalty is at most
    that of the output limit, so its final score is at most
    log P / lp(limit). ``top_n`` may be a tensor: one compiled search
    serves every ``top_n``."""
    k = ops.shape(log_probs)[1]
    nth_index = ops.convert_to_tensor(top_n, "int32") - 1
    # The n-th score is recomputed, not read from top_k's values: using
    # those values makes XLA:CPU's step several times slower.
    nth = ops.take(log_probs, nth_index, axis=1) / length_penalty(
        ops.cast(ops.take(lengths, nth_index, axis=1), "float32"), alpha
    )
    best_open = ops.max(ops.where(finished, IMPOSSIBLE, log_probs), axis=1)
    in_top = ops.less_equal(ops.arange(k, dtype="int32"), nth_index)[None, :]
    return ops.logical_and(
        ops.all(ops.logical_or(finished, ops.logical_not(in_top)), axis=1),
        ops.logical_or(
            ops.all(finished, axis=1),
            ops.greater_equal(nth, best_open / final_penalty),
        ),
    )


def _beam_start(rows, k, max_length, limits, ids):
    """The beam search's first loop values, before the step's state: index,
    tokens, output, log P, lengths, finished, done."""
    # All K hypotheses start as the same [START]; only the first may be
    # extended at the first step, or the beam would hold K copies.
    first = ops.equal(ops.arange(k), 0)[None, :]
    nothing_to_do = ops.less_equal(limits, 0)
    return (
        ops.convert_to_tensor(0, "int32"),
        ops.full((rows * k,), ids.start, "int32"),
        ops.full((rows, k, max_length), ids.pad, "int32"),
        ops.where(first, 0.0, IMPOSSIBLE) + ops.zeros((rows, k), "float32"),
        ops.zeros((rows, k), "int32"),
        ops.logical_and(nothing_to_do, ops.ones((rows, k), "bool")),
        nothing_to_do[:, 0],
    )


# beam_search's ops without its host-side checks: what graphs trace.
def beam_loop(
    model,
    source_ids,
    max_lengths,
    max_length,
    use_cache,
    ids,
    beam_size,
    alpha,
    top_n=None,
):
    rows = ops.shape(source_ids)[0]
    k = beam_size
    top_n = k if top_n is None else top_n
    columns = ops.arange(max_length)
    steps = ops.max(max_lengths)
    limits = max_lengths[:, None]  # (B, 1)
    # The largest length penalty a hypothesis of each input can reach.
    final_penalty = length_penalty(ops.cast(max_lengths, "float32"), alpha)  # (B,)
    # Row b, hypothesis j sits at b * K + j of the decoder's batch.
    row_starts = (ops.arange(rows, dtype="int32") * k)[:, None]

    def cond(index, tokens, output, log_probs, lengths, finished, done, state):
        return ops.logical_and(ops.less(index, steps), ops.logical_not(ops.all(done)))

    def body(step, index, tokens, output, log_probs, lengths, finished, done, state):
        logits, state = step(tokens, index, state)
        step_log_probs = _log_probs(logits, ids)
        vocab = ops.shape(step_log_probs)[-1]
        step_log_probs = ops.reshape(step_log_probs, (rows, k, vocab))
        # A finished hypothesis has one candidate: itself, unchanged (its
        # "next token" is padding, at no cost).
        carry_over = ops.where(ops.equal(ops.arange(vocab), ids.pad), 0.0, IMPOSSIBLE)
        step_log_probs = ops.where(
            finished[:, :, None], carry_over[None, None, :], step_log_probs
        )
        candidates = log_probs[:, :, None] + step_log_probs  # (B, K, V)
        candidate_lengths = ops.where(finished, lengths, index + 1)  # (B, K)
        penalty = length_penalty(ops.cast(candidate_lengths, "float32"), alpha)
        ranking = candidates / penalty[:, :, None]
        # The K best of the K * V candidates of each input, best first.
        _, best = ops.top_k(ops.reshape(ranking, (rows, k * vocab)), k)  # (B, K)
        parents = best // vocab
        chosen = ops.cast(best % vocab, "int32")
        log_probs = ops.take_along_axis(
            ops.reshape(candidates, (rows, k * vocab)), best, axis=1
        )
        parent_finished = ops.take_along_axis(finished, parents, axis=1)
        lengths = ops.take_along_axis(candidate_lengths, parents, axis=1)
        chosen = ops.where(parent_finished, ids.pad, chosen)
        finished = ops.logical_or(
            parent_finished, _stops(chosen, index, limits, ids.end)
        )
        done = ops.logical_or(
            done, _settled(log_probs, lengths, finished, top_n, final_penalty, alpha)
        )
        # Each kept hypothesis continues its parent's tokens, cache and state.
        output = ops.take_along_axis(output, parents[:, :, None], axis=1)
        output = ops.where(_at_column(columns, index)[None], chosen[:, :, None], output)
        flat_parents = ops.reshape(row_starts + ops.cast(parents, "int32"), (-1,))
        state = keras.tree.map_structure(
            lambda x: ops.take(x, flat_parents, axis=0), state
        )
        return (
            index + 1,
            ops.reshape(chosen, (-1,)),
            output,
            log_probs,
            lengths,
            finished,
            done,
            state,
        )

    start = _beam_start(rows, k, max_length, limits, ids)
    _, _, output, log_probs, lengths, _, _, _ = _search_loop(
        model, source_ids, max_length, use_cache, k, cond, body, start
    )
    scores = log_probs / length_penalty(ops.cast(lengths, "float32"), alpha)
    return output, scores, log_probs


def _beam_function(model, key):
    """The function of ``(source_ids, max_lengths, alpha, top_n)`` that
    ``beam_search`` compiles for ``key``."""
    _, max_length, use_cache, ids, beam_size, form = key
    if form == "gnmt":
        return lambda src, lengths, a, top_n: beam_loop(
            model, src, lengths, max_length, use_cache, ids, beam_size, a, top_n
        )
    return lambda src, lengths, a, top_n: transformers_beam_loop(
        model,
        src,
        lengths,
        max_length,
        use_cache,
        ids,
        beam_size,
        a,
        lambda logits, last: _log_probs(logits, ids, last),
    )


# -- compilation ------------------------------------------------------------------


def compiled_function(model, key, fn):
    """The compiled ``fn`` for ``key`` (the computation and its static
    arguments: a search, or ``attention_maps``' program), made once per
    model and kept on it."""
    # Two threads translating at once must share one compiled function per
    # key, or each would trace and compile its own (seconds on TF and JAX).
    with _COMPILE_LOCK:
        functions = getattr(model, "_decoding_functions", None)
        if functions is None:
            functions = {}
            # Past Keras' attribute tracking: a cache of functions is not state
            # to save or to count as layers.
            object.__setattr__(model, "_decoding_functions", functions)
        if key not in functions:
            # Builds the wrapper only; tracing happens at its first call.
            functions[key] = backend.compile_loop(model, fn)
        return functions[key]


def _check_inputs(model, source_ids, max_lengths, max_length):
    """Checks on the host, before anything is compiled: inside the compiled
    loop a bad id would give garbage (JAX) or a late, obscure error, and a
    check per call would cost a host round trip. A model of one's own
    without ``src_vocab_size`` or ``max_length`` checks in its layers."""
    source_ids = np.asarray(source_ids)
    if source_ids.ndim != 2 or not np.issubdtype(source_ids.dtype, np.integer):
        raise ValueError(
            "source_ids must be a 2-D integer array (batch, length). "
            f"Received: shape={source_ids.shape}, dtype={source_ids.dtype}"
        )
    vocab_size = getattr(model, "src_vocab_size", None)
    source_limit = target_limit = getattr(model, "max_length", None)
    if vocab_size is not None:
        _inputs.check_ids(source_ids, None, vocab_size)
    if source_limit is not None and source_ids.shape[1] > source_limit:
        raise ValueError(
            f"source_ids is longer than the model's max_length={source_limit}. "
            f"Received: source_ids.shape={source_ids.shape}"
        )
    rows = source_ids.shape[0]
    max_lengths = np.broadcast_to(np.asarray(max_lengths, "int32"), (rows,))
    if max_length is None:
        max_length = int(max_lengths.max()) if rows else 1
    if max_lengths.size and (max_lengths.min() < 0 or max_lengths.max() > max_length):
        raise ValueError(
            f"max_lengths must be in [0, max_length={max_length}]. Received "
            f"values from {max_lengths.min()} to {max_lengths.max()}."
        )
    if target_limit is not None and max_length > target_limit:
        raise ValueError(
            f"max_length={max_length} is more than the model's "
            f"max_length={target_limit} (positions of the decoder)."
        )
    return source_ids.astype("int32"), np.array(max_lengths), int(max_length)


def unchecked_loop(model):
    """The compiled loop without the layers' checks, where ``_check_inputs``
    checked the ids on the host; a model without ``src_vocab_size`` keeps
    them. (Decided per model: the loop is compiled once per shape.)"""
    if getattr(model, "src_vocab_size", None) is None:
        return contextlib.nullcontext()
    return _checks.inputs_checked()


def _numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


SpecialIds = collections.namedtuple("SpecialIds", "start end pad")


def check_special_ids(start_id, end_id, pad_id):
    """The special ids as ``SpecialIds`` of ints (``end_id`` may be None),
    or ``TypeError``."""
    for name, value in (("start_id", start_id), ("pad_id", pad_id), ("end_id", end_id)):
        if value is None and name == "end_id":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int. Received: {name}={value!r}")
    return SpecialIds(
        int(start_id), None if end_id is None else int(end_id), int(pad_id)
    )


def greedy_search(
    model,
    source_ids,
    max_lengths,
    max_length=None,
    use_cache=True,
    start_id=START_ID,
    end_id=END_ID,
    pad_id=PAD_ID,
    forced_end=False,
):
    """Greedy decoding: the most probable next token at every step.

    Args:
        model: a ``Transformer``, or any model with the methods listed in
            this module's docstring.
        source_ids: ``(B, S)`` int array of source ids, ``pad_id``-padded.
        max_lengths: int or ``(B,)`` ints: the most tokens to generate per
            row (the end token included). 0 generates nothing.
        max_length: int, the width of the output and of the cache (default
            ``max(max_lengths)``). A fixed value (a bucket) lets the compiled
            loop serve many calls. At most the model's ``max_length``.
        use_cache: bool, decode with the key/value cache (default) or run
            the decoder on the whole prefix at every step.
        start_id: the first decoder input of every row.
        end_id: the token that ends a hypothesis, or None to always generate
            ``max_lengths`` tokens (for benchmarks; the end token is then an
            ordinary token).
        pad_id: the padding id: never generated, and what follows a
            finished row.
        forced_end: bool, end each row with the end token at the last step
            its limit allows, as transformers' ``forced_eos_token_id`` does
            (default False: the row stops there without it).

    Returns:
        ``(tokens, scores)``: ``(B, max_length)`` int32 NumPy array, the
        generated tokens of each row followed by ``pad_id``; and ``(B,)``
        float32, each row's log-probability ``log P(Y | X)``.
    """
    ids = check_special_ids(start_id, end_id, pad_id)
    source_ids, max_lengths, max_length = _check_inputs(
        model, source_ids, max_lengths, max_length
    )
    forced_end = bool(forced_end) and ids.end is not None
    key = ("greedy", max_length, bool(use_cache), ids, forced_end)
    run = compiled_function(
        model,
        key,
        lambda src, lengths: greedy_loop(
            model, src, lengths, max_length, bool(use_cache), ids, forced_end
        ),
    )
    with unchecked_loop(model):
        tokens, scores = run(source_ids, max_lengths)
    return _numpy(tokens), _numpy(scores)


def beam_search(
    model,
    source_ids,
    max_lengths,
    beam_size=BEAM_SIZE,
    length_penalty=LENGTH_PENALTY,
    max_length=None,
    use_cache=True,
    start_id=START_ID,
    end_id=END_ID,
    pad_id=PAD_ID,
    top_n=None,
    length_penalty_form="gnmt",
):
    """Beam search with the GNMT length penalty (paper §6.1: 4 beams, α = 0.6),
    or as transformers' ``generate`` searches.

    Args:
        model, source_ids, max_lengths, max_length, use_cache, start_id,
            end_id, pad_id: as for ``greedy_search``.
        beam_size: int >= 1, hypotheses kept per input. 1 is greedy search.
        length_penalty: float >= 0, α of ``((5 + |Y|) / 6) ** α``;
            0 ranks by log-probability alone, larger values favour longer
            outputs.
        top_n: int in ``[1, beam_size]`` (default ``beam_size``): how many
            of the best hypotheses must be exact. An input stops once its
            ``top_n`` best are finished and no unfinished hypothesis can
            overtake them; the hypotheses below them are then whatever the
            beam held at that step (unfinished ones without the end token).
            ``Translator.translate`` needs only the best (``top_n=1``).
            The ``"transformers"`` form has its own rule and ignores it.
        length_penalty_form: ``"gnmt"`` (this module's search) or
            ``"transformers"`` (``keras_transformer.search.transformers_beam``:
            scores ``log P(Y | X) / |Y| ** α``, and the end token forced at
            each row's limit).

    Returns:
        ``(tokens, scores, log_probs)``: ``(B, beam_size, max_length)`` int32,
        each row's hypotheses best first (tokens followed by ``pad_id``);
        their scores ``log P(Y | X) / lp(Y)`` ``(B, beam_size)``, and their
        log-probabilities. A hypothesis that could not be filled (a
        vocabulary smaller than the beam) has a score below -1e29.
    """
    beam_size = check_beam_size(beam_size)
    alpha = check_length_penalty(length_penalty)
    top_n = beam_size if top_n is None else top_n
    if isinstance(top_n, bool) or not isinstance(top_n, (int, np.integer)):
        raise TypeError(f"top_n must be an int. Received: top_n={top_n!r}")
    if not 1 <= top_n <= beam_size:
        raise ValueError(
            f"top_n must be between 1 and beam_size={beam_size}. "
            f"Received: top_n={top_n}"
        )
    top_n = int(top_n)
    form = check_length_penalty_form(length_penalty_form)
    if form == "transformers":
        top_n = beam_size  # its own stopping rule
    ids = check_special_ids(start_id, end_id, pad_id)
    if form == "transformers" and ids.end is None:
        raise ValueError('length_penalty_form="transformers" needs an end_id.')
    source_ids, max_lengths, max_length = _check_inputs(
        model, source_ids, max_lengths, max_length
    )
    # top_n is an argument of the program, not part of its key: the n best
    # of any n share the search compiled for the best alone.
    key = ("beam", max_length, bool(use_cache), ids, beam_size, form)
    run = compiled_function(model, key, _beam_function(model, key))
    with unchecked_loop(model):
        tokens, scores, log_probs = run(
            source_ids,
            max_lengths,
            np.asarray(alpha, "float32"),
            np.asarray(top_n, "int32"),
        )
    return _numpy(tokens), _numpy(scores), _numpy(log_probs)
