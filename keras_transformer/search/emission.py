"""What a search step may emit: one part of the search, shared by every
selection rule (``keras_transformer.search.skeleton``).

The pad and start ids are never generated (neither occurs inside a target
sentence). With ``forced_end`` a row at the last step its limit allows may
only emit the end token, as transformers' ``forced_eos_token_id`` does. The
banned ids are removed before the softmax, so the probabilities of the
others are renormalized (transformers' ``renormalize_logits=True``; for the
paper's search it is the same, as the model never puts mass on them after
training).
"""

from keras import ops

# Log-probability of an impossible candidate. Finite, so that arithmetic on it
# (sums, divisions by the length penalty) never makes a NaN.
IMPOSSIBLE = -1e30


def log_probs(logits, ids, last=None):
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


class Emission:
    """The step's log-probabilities ``(rows * beam_size, V)`` from its logits,
    under the rules above."""

    def __init__(self, ids, forced_end=False):
        self.ids = ids
        self.forced_end = bool(forced_end) and ids.end is not None

    def __call__(self, logits, index, max_lengths, beam_size):
        last = None
        if self.forced_end:
            last = ops.greater_equal(index + 1, max_lengths)
            if beam_size > 1:
                # Row b's hypotheses sit at b * K ... b * K + K - 1.
                last = ops.repeat(last, beam_size, axis=0)
        return log_probs(logits, self.ids, last)
