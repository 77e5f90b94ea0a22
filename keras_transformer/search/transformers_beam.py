"""Beam search as Hugging Face transformers' ``generate`` runs it, so that a
model imported from a Marian checkpoint translates as it does there.

It differs from the paper's search (``keras_transformer.search.decoding``)
in four ways, each of which can change the output:

- **Two pools.** The beam holds only unfinished hypotheses, ranked by their
  raw ``log P(Y | X)``; finished ones go to a separate pool of ``beam_size``,
  ranked by ``log P(Y | X) / |Y| ** α`` (|Y| counts the end token). The
  paper's search keeps both in one beam, ranked by the GNMT score.
- **2K candidates.** Each step takes the ``2 · beam_size`` best extensions
  by ``log P``; of those, one that ends with the end token (or reaches the
  output limit) enters the pool only if it ranks among the first
  ``beam_size``, and the best ``beam_size`` that do not end continue.
- **When to stop** (``early_stopping=False``): once the pool is full and the
  best unfinished hypothesis, scored at its current length, no longer beats
  the pool's worst. This is a heuristic: a longer hypothesis could still
  have won.
- **The end token is forced** at the last step the output limit allows (the
  ``forced_eos_token_id`` of OPUS-MT's generation configs), at no cost.

The pad and start ids are never generated, and the log-probabilities are
renormalized after they are removed (``renormalize_logits=True``, as
OPUS-MT's generation configs set). The arithmetic follows
``GenerationMixin._beam_search`` of transformers 5, -1e9 sentinels included,
so that ties and empty slots fall the same way.
"""

from keras import ops

from keras_transformer.search.options import transformers_length_penalty

# transformers' sentinel for a hypothesis that may not be chosen.
_EXCLUDED = -1.0e9


def _gather(x, indices):
    """``x[b, indices[b, j], ...]``: rows of each input's beam."""
    while len(indices.shape) < len(x.shape):
        indices = indices[..., None]
    return ops.take_along_axis(x, indices, axis=1)


def _finish(pool, candidates, alpha, index, open_rows, k):
    """The pool after this step's candidates that end: the ``k`` best of the
    pool and of those, by ``log P / |Y| ** α``; a row no longer open keeps
    its pool."""
    tokens, scores, log_probs, filled = pool
    cand_tokens, cand_log_probs, ends = candidates
    cand_scores = cand_log_probs / transformers_length_penalty(
        ops.cast(index + 1, "float32"), alpha
    )
    ranked_first = ops.arange(2 * k) < k
    entering = ops.logical_and(ends, ranked_first[None, :])
    cand_scores = cand_scores + ops.where(open_rows[:, None], 0.0, _EXCLUDED)
    cand_scores = cand_scores + ops.where(entering, 0.0, _EXCLUDED)
    merged_scores = ops.concatenate([scores, cand_scores], axis=1)
    _, best = ops.top_k(merged_scores, k)
    merged = (
        ops.concatenate([tokens, cand_tokens], axis=1),
        merged_scores,
        ops.concatenate([log_probs, cand_log_probs], axis=1),
        ops.concatenate([filled, entering], axis=1),
    )
    updated = tuple(_gather(x, best) for x in merged)
    return tuple(
        ops.where(_expand(open_rows, len(old.shape)), x, old)
        for x, old in zip(updated, pool, strict=True)
    )


def _expand(rows, rank):
    while len(rows.shape) < rank:
        rows = rows[..., None]
    return rows


def _improvable(open_rows, best_running, pool, alpha, index):
    """transformers' stopping heuristic (``early_stopping=False``): a row stays
    open while its pool has an empty slot or its best unfinished hypothesis,
    scored at its current length, beats the pool's worst."""
    _, scores, _, filled = pool
    best_possible = best_running / transformers_length_penalty(
        ops.cast(index + 1, "float32"), alpha
    )
    worst = ops.where(filled, ops.min(scores, axis=1, keepdims=True), _EXCLUDED)
    return ops.logical_and(open_rows, ops.any(best_possible[:, None] > worst, axis=1))


class TwoPools:
    """transformers' beam search as a selection rule of the search loop
    (``keras_transformer.search.skeleton``; its emission forces the end token
    at each row's limit). Carry: ``(running tokens (B, K, T), running log P
    (B, K), pool, open rows (B,))``, the pool ``(tokens, scores, log P,
    filled)``; the result is the pool's ``(tokens, scores, log P)``, best
    first."""

    def __init__(self, max_lengths, max_length, ids, beam_size, alpha):
        self.max_lengths = max_lengths
        self.columns = ops.arange(max_length)
        self.ids = ids
        self.beam_size = beam_size
        self.alpha = alpha

    def start(self, rows, max_length):
        return _start(rows, self.beam_size, max_length, self.max_lengths, self.ids)

    def open(self, carry):
        return ops.any(carry[-1])

    def select(self, carry, log_probs, index):
        running, running_scores, pool, open_rows = carry
        rows, k = ops.shape(running_scores)[0], self.beam_size
        vocab = ops.shape(log_probs)[-1]
        totals = ops.reshape(log_probs, (rows, k, vocab))
        totals = totals + running_scores[:, :, None]
        # The 2K best extensions of each input's beam, by log P.
        cand_log_probs, best = ops.top_k(ops.reshape(totals, (rows, k * vocab)), 2 * k)
        parents = best // vocab
        chosen = ops.cast(best % vocab, "int32")
        cand_tokens = _gather(running, parents)
        at_index = _at_column(self.columns, index)
        cand_tokens = ops.where(at_index, chosen[:, :, None], cand_tokens)
        ends = ops.logical_or(
            ops.equal(chosen, self.ids.end),
            ops.greater_equal(index + 1, self.max_lengths)[:, None],
        )
        # The K best that do not end continue.
        continuing = cand_log_probs + ops.where(ends, _EXCLUDED, 0.0)
        _, kept = ops.top_k(continuing, k)
        running = _gather(cand_tokens, kept)
        running_scores = _gather(continuing, kept)
        kept_parents = _gather(parents, kept)
        pool = _finish(
            pool, (cand_tokens, cand_log_probs, ends), self.alpha, index, open_rows, k
        )
        open_rows = ops.logical_and(
            _improvable(open_rows, running_scores[:, 0], pool, self.alpha, index),
            ops.less(index + 1, self.max_lengths),
        )
        carry = (running, running_scores, pool, open_rows)
        return carry, kept_parents, _gather(chosen, kept)

    def result(self, carry):
        tokens, scores, log_probs, _ = carry[2]
        return tokens, scores, log_probs


def _start(rows, k, max_length, max_lengths, ids):
    """The selection's first carry: the beam's tokens and log P (only the
    first hypothesis may be extended at the first step, or the beam would
    hold K copies), the empty pool (tokens, scores, log P, filled), and the
    rows still open."""
    first = ops.equal(ops.arange(k), 0)[None, :]
    pool = (
        ops.full((rows, k, max_length), ids.pad, "int32"),
        ops.full((rows, k), _EXCLUDED, "float32"),
        ops.full((rows, k), _EXCLUDED, "float32"),
        ops.zeros((rows, k), "bool"),
    )
    return (
        ops.full((rows, k, max_length), ids.pad, "int32"),
        ops.where(first, 0.0, _EXCLUDED) + ops.zeros((rows, k), "float32"),
        pool,
        ops.greater(max_lengths, 0),
    )


def _at_column(columns, index):
    return ops.equal(columns, index)[None, None, :]
