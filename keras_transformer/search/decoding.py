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

Every search is one loop (``search.skeleton``) with parts: what a step may
emit (``search.emission``: pad and start never, the end token forced at the
limit for transformers' rules) and a selection rule that keeps the next
hypotheses, with its length penalty:

- ``greedy_search``: ``search.greedy``, the most probable token;
- ``beam_search``: the paper's (§6.1: "beam search with a beam size of 4
  and length penalty α = 0.6"), ``search.one_beam``: finished and
  unfinished hypotheses in one beam, ranked by ``log P(Y | X) / lp(Y)``
  with the GNMT penalty of Wu et al. (2016), ``lp(Y) = ((5 + |Y|) / 6) **
  α``; ``translate`` needs only the best, and a row stops once its best is
  settled (``top_n``). keras-hub's ``BeamSampler`` is not used: it has no
  length penalty and no finished hypotheses;
- ``beam_search(..., length_penalty_form="transformers")``: Hugging Face
  transformers' beam search (``search.transformers_beam``), for models
  imported from checkpoints that expect it;
- ``beam_search(..., constraints=...)``: lexically constrained beam search
  (``search.constrained``), the paper's beam with constraint banks, with
  either length penalty.

Each source is encoded once and its hypotheses share the encoder output.
"""

import collections
import contextlib
import threading

import numpy as np
from keras import ops

from keras_transformer import backend
from keras_transformer._guards import checks as _checks
from keras_transformer._guards import inputs as _inputs
from keras_transformer.search.constrained import ConstrainedBeam, constraint_arrays
from keras_transformer.search.emission import Emission
from keras_transformer.search.greedy import Greedy
from keras_transformer.search.one_beam import OneBeam
from keras_transformer.search.options import (
    BEAM_SIZE,
    LENGTH_PENALTY,
    check_beam_size,
    check_length_penalty,
    check_length_penalty_form,
    length_penalty,
    transformers_length_penalty,
)
from keras_transformer.search.shapes import constraint_width
from keras_transformer.search.skeleton import run_search
from keras_transformer.search.transformers_beam import TwoPools
from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID

_COMPILE_LOCK = threading.Lock()


# -- the searches, as functions of tensors: the loop and its parts ---------------


def greedy_loop(
    model, source_ids, max_lengths, max_length, use_cache, ids, forced_end=False
):
    """``greedy_search``'s ops without its host-side checks (what graphs trace)."""
    return run_search(
        model,
        source_ids,
        max_lengths,
        max_length,
        use_cache,
        Emission(ids, forced_end),
        Greedy(max_lengths, max_length, ids),
    )


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
    form="gnmt",
    constraints=None,
):
    """``beam_search``'s ops without its host-side checks (what graphs
    trace): the loop with the parts ``form`` and ``constraints`` pick."""
    top_n = beam_size if top_n is None else top_n
    forced_end = form == "transformers"
    penalty = transformers_length_penalty if forced_end else length_penalty
    if constraints is not None:
        selection = ConstrainedBeam(
            max_lengths, max_length, ids, beam_size, alpha, penalty, top_n,
            constraints=constraints,
        )  # fmt: skip
    elif form == "transformers":
        selection = TwoPools(max_lengths, max_length, ids, beam_size, alpha)
    else:
        selection = OneBeam(
            max_lengths, max_length, ids, beam_size, alpha, penalty, top_n
        )
    return run_search(
        model,
        source_ids,
        max_lengths,
        max_length,
        use_cache,
        Emission(ids, forced_end),
        selection,
    )


def _beam_function(model, key):
    """The function of ``(source_ids, max_lengths, alpha, top_n,
    *constraints)`` that ``beam_search`` compiles for ``key``."""
    _, max_length, use_cache, ids, beam_size, form, constraint_width = key

    def run(src, lengths, alpha, top_n, *constraints):
        return beam_loop(
            model, src, lengths, max_length, use_cache, ids, beam_size, alpha,
            top_n, form, constraints if constraint_width else None,
        )  # fmt: skip

    return run


# -- compilation ------------------------------------------------------------------


def compiled_function(model, key, fn):
    """The compiled ``fn`` for ``key`` (the computation and its static
    arguments: a search, or ``attention_maps``' program), made once per
    model and kept on it."""
    # Two threads translating at once must share one compiled function per
    # key, or each would trace and compile its own (seconds on TF and JAX).
    with _COMPILE_LOCK:
        compiled = getattr(model, "_decoding_functions", None)
        if compiled is None:
            compiled = model._decoding_functions = _CompiledFunctions()
        functions = compiled.by_key
        if key not in functions:
            # Builds the wrapper only; tracing happens at its first call.
            functions[key] = backend.compile_loop(model, fn)
        return functions[key]


class _CompiledFunctions:
    """A model's compiled functions, by key.

    Kept on the model, which they refer to, so that they go with it (in a
    table of their own they would keep every model alive). A plain object,
    not a dict: Keras tracks the dicts, lists and variables set on a layer
    as its state, and this is no state to save or to count as layers.
    """

    __slots__ = ("by_key",)

    def __init__(self):
        self.by_key = {}


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
    constraints=None,
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
        constraints: optional list, one per row of ``source_ids`` (missing
            rows have none), of lists of phrases, each a non-empty list of
            target ids that the output must hold, contiguous
            (``keras_transformer.search.constrained``: lexically
            constrained beam search, with the length penalty of
            ``length_penalty_form``). None (default): no constraints, and
            the search is the plain one of ``length_penalty_form``. The
            hypotheses are then ranked by constraint tokens met, then
            score; a constraint that cannot fit in a row's limit is missing
            from its output (check it there).

    Returns:
        ``(tokens, scores, log_probs)``: ``(B, beam_size, max_length)`` int32,
        each row's hypotheses best first (tokens followed by ``pad_id``);
        their scores ``log P(Y | X) / lp(Y)`` ``(B, beam_size)``, and their
        log-probabilities. A hypothesis that could not be filled (a
        vocabulary smaller than the beam) has a score below -1e29.
    """
    beam_size = check_beam_size(beam_size)
    alpha = check_length_penalty(length_penalty)
    top_n = _check_top_n(top_n, beam_size)
    form = check_length_penalty_form(length_penalty_form)
    if form == "transformers" and constraints is None:
        top_n = beam_size  # its own stopping rule
    ids = check_special_ids(start_id, end_id, pad_id)
    if form == "transformers" and ids.end is None:
        raise ValueError('length_penalty_form="transformers" needs an end_id.')
    source_ids, max_lengths, max_length = _check_inputs(
        model, source_ids, max_lengths, max_length
    )
    arrays = ()
    if constraints is not None:
        arrays = _constraint_inputs(model, constraints, source_ids.shape[0], ids)
    # top_n is an argument of the program, not part of its key: the n best
    # of any n share the search compiled for the best alone; the
    # constraints' width is part of it (bucketed).
    width = arrays[0].shape[1] if arrays else 0
    key = ("beam", max_length, bool(use_cache), ids, beam_size, form, width)
    run = compiled_function(model, key, _beam_function(model, key))
    with unchecked_loop(model):
        tokens, scores, log_probs = run(
            source_ids,
            max_lengths,
            np.asarray(alpha, "float32"),
            np.asarray(top_n, "int32"),
            *arrays,
        )
    return _numpy(tokens), _numpy(scores), _numpy(log_probs)


def _check_top_n(top_n, beam_size):
    top_n = beam_size if top_n is None else top_n
    if isinstance(top_n, bool) or not isinstance(top_n, (int, np.integer)):
        raise TypeError(f"top_n must be an int. Received: top_n={top_n!r}")
    if not 1 <= top_n <= beam_size:
        raise ValueError(
            f"top_n must be between 1 and beam_size={beam_size}. "
            f"Received: top_n={top_n}"
        )
    return int(top_n)


def _constraint_inputs(model, constraints, rows, ids):
    """``constraint_arrays`` of checked ``constraints``, as wide as the
    bucket of the most constraint tokens a row has."""
    try:
        constraints = [[[t for t in phrase] for phrase in row] for row in constraints]
    except TypeError:
        raise TypeError(
            "constraints must be a list (one per row) of lists of phrases "
            "(lists of ids)."
        ) from None
    if len(constraints) > rows:
        raise ValueError(
            f"constraints has {len(constraints)} rows, source_ids only {rows}."
        )
    vocab_size = getattr(model, "tgt_vocab_size", None)
    special = {ids.start, ids.end, ids.pad}
    for r, row in enumerate(constraints):
        for phrase in row:
            if not phrase:
                raise ValueError(f"constraints[{r}] has an empty phrase.")
            for token in phrase:
                if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
                    raise TypeError(
                        f"constraints[{r}]: ids must be ints. Received: {token!r}"
                    )
                if (
                    token in special
                    or token < 0
                    or (vocab_size is not None and token >= vocab_size)
                ):
                    raise ValueError(
                        f"constraints[{r}]: {token} is not an id a search can "
                        f"produce (the special ids {sorted(special)} and ids "
                        "outside the target vocabulary cannot be)."
                    )
    most = max([sum(len(p) for p in row) for row in constraints] + [1])
    return constraint_arrays(constraints, rows, constraint_width(most))
