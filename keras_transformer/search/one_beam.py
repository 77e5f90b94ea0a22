"""The paper's beam search (§6.1) as a selection rule of the search loop
(``keras_transformer.search.skeleton``): one beam per row that holds
finished and unfinished hypotheses alike, ranked by a length-penalized
score.

A hypothesis that has produced the end token is finished: it stays in the
beam with its score and competes with the unfinished ones. At each step
every unfinished hypothesis is extended by every token, each finished one
is carried over unchanged, and the ``beam_size`` best of all these
candidates are kept, by ``log P(Y | X) / lp(Y)`` (the length penalty is a
part: the GNMT form of Wu et al. (2016) for the paper's search). A row is
done when its whole beam is finished, or, with ``top_n``, as soon as its
``top_n`` best are finished and no unfinished hypothesis can overtake them
(a bound: log P only falls, and lp is largest at the output limit).
Keeping finished hypotheses in the beam makes ``beam_size=1`` exactly
greedy search.
"""

from keras import ops

from keras_transformer.search.emission import IMPOSSIBLE
from keras_transformer.search.skeleton import at_column, stops


def first_only(rows, k):
    """``(B, K)`` log P of the first step's beam: all K hypotheses start as
    the same [START]; only the first may be extended, or the beam would
    hold K copies."""
    first = ops.equal(ops.arange(k), 0)[None, :]
    return ops.where(first, 0.0, IMPOSSIBLE) + ops.zeros((rows, k), "float32")


def carry_over(log_probs, finished, pad_id):
    """``(B, K, V)`` step log-probabilities where a finished hypothesis has one
    candidate: itself, unchanged (its "next token" is padding, at no cost)."""
    vocab = ops.shape(log_probs)[-1]
    kept = ops.where(ops.equal(ops.arange(vocab), pad_id), 0.0, IMPOSSIBLE)
    return ops.where(finished[:, :, None], kept[None, None, :], log_probs)


class OneBeam:
    """Carry: ``(output (B, K, T), log P (B, K), lengths (B, K), finished
    (B, K), done (B,))``; the result is ``(output, scores, log P)``, best
    first.

    Args:
        max_lengths: ``(B,)`` each row's output limit.
        max_length: the output width.
        ids: the special ids.
        beam_size: K.
        alpha: the length penalty's α (a tensor: one program serves all).
        penalty: ``penalty(lengths, alpha)``, the length penalty.
        top_n: how many of the best must be exact (a tensor may be given).
    """

    def __init__(self, max_lengths, max_length, ids, beam_size, alpha, penalty, top_n):
        self.max_lengths = max_lengths
        self.limits = max_lengths[:, None]  # (B, 1)
        self.columns = ops.arange(max_length)
        self.ids = ids
        self.beam_size = beam_size
        self.alpha = alpha
        self.penalty = penalty
        self.top_n = top_n
        # The largest length penalty a hypothesis of each row can reach.
        self.final_penalty = penalty(ops.cast(max_lengths, "float32"), alpha)

    def start(self, rows, max_length):
        k = self.beam_size
        nothing_to_do = ops.less_equal(self.limits, 0)
        return (
            ops.full((rows, k, max_length), self.ids.pad, "int32"),
            first_only(rows, k),
            ops.zeros((rows, k), "int32"),
            ops.logical_and(nothing_to_do, ops.ones((rows, k), "bool")),
            nothing_to_do[:, 0],
        )

    def open(self, carry):
        return ops.logical_not(ops.all(carry[-1]))

    def candidates(self, carry, log_probs, index):
        """``(candidates, ranking, candidate lengths)``: each hypothesis
        extended by each token, ``(B, K, V)``, and their scores."""
        output, beam_log_probs, lengths, finished, done = carry
        rows, k = ops.shape(beam_log_probs)[0], self.beam_size
        step_log_probs = ops.reshape(log_probs, (rows, k, ops.shape(log_probs)[-1]))
        step_log_probs = carry_over(step_log_probs, finished, self.ids.pad)
        candidates = beam_log_probs[:, :, None] + step_log_probs  # (B, K, V)
        candidate_lengths = ops.where(finished, lengths, index + 1)  # (B, K)
        penalty = self.penalty(ops.cast(candidate_lengths, "float32"), self.alpha)
        return candidates, candidates / penalty[:, :, None], candidate_lengths

    def select(self, carry, log_probs, index):
        output, _, _, finished, done = carry
        candidates, ranking, candidate_lengths = self.candidates(
            carry, log_probs, index
        )
        rows, k, vocab = ops.shape(candidates)
        # The K best of the K * V candidates of each row, best first.
        _, best = ops.top_k(ops.reshape(ranking, (rows, k * vocab)), k)  # (B, K)
        parents = best // vocab
        chosen = ops.cast(best % vocab, "int32")
        beam_log_probs = ops.take_along_axis(
            ops.reshape(candidates, (rows, k * vocab)), best, axis=1
        )
        carry, parents, chosen = self.keep(
            carry, parents, chosen, beam_log_probs, candidate_lengths, index
        )
        output, beam_log_probs, lengths, finished, done = carry
        done = ops.logical_or(
            done, self.settled(beam_log_probs, lengths, finished, self.top_n)
        )
        return (output, beam_log_probs, lengths, finished, done), parents, chosen

    def keep(self, carry, parents, chosen, beam_log_probs, candidate_lengths, index):
        """The carry after keeping the candidates ``(parents, chosen)``, with
        their log P (its ``done`` not yet updated); also returns ``parents``
        and the tokens fed next."""
        output, _, _, finished, done = carry
        parent_finished = ops.take_along_axis(finished, parents, axis=1)
        lengths = ops.take_along_axis(candidate_lengths, parents, axis=1)
        chosen = ops.where(parent_finished, self.ids.pad, chosen)
        finished = ops.logical_or(
            parent_finished, stops(chosen, index, self.limits, self.ids.end)
        )
        # Each kept hypothesis continues its parent's tokens.
        output = ops.take_along_axis(output, parents[:, :, None], axis=1)
        column = at_column(self.columns, index)[None]
        output = ops.where(column, chosen[:, :, None], output)
        carry = (output, beam_log_probs, lengths, finished, done)
        return carry, parents, chosen

    def settled(self, log_probs, lengths, finished, top_n):
        """``(B,)``: True where a row's ``top_n`` best hypotheses (the beam
        is best first) are finished and no unfinished one can ever outrank
        them: its log P only falls with each token, and its length penalty
        is at most that of the output limit, so its final score is at most
        log P / lp(limit)."""
        k = ops.shape(log_probs)[1]
        nth_index = ops.convert_to_tensor(top_n, "int32") - 1
        # The n-th score is recomputed, not read from top_k's values: using
        # those values makes XLA:CPU's step several times slower.
        nth = ops.take(log_probs, nth_index, axis=1) / self.penalty(
            ops.cast(ops.take(lengths, nth_index, axis=1), "float32"), self.alpha
        )
        best_open = ops.max(ops.where(finished, IMPOSSIBLE, log_probs), axis=1)
        in_top = ops.less_equal(ops.arange(k, dtype="int32"), nth_index)[None, :]
        return ops.logical_and(
            ops.all(ops.logical_or(finished, ops.logical_not(in_top)), axis=1),
            ops.logical_or(
                ops.all(finished, axis=1),
                ops.greater_equal(nth, best_open / self.final_penalty),
            ),
        )

    def result(self, carry):
        output, log_probs, lengths, _, _ = carry
        scores = log_probs / self.penalty(ops.cast(lengths, "float32"), self.alpha)
        return output, scores, log_probs
