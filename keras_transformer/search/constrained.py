"""Lexically constrained beam search: every output holds every given
constraint (a word or phrase as target token ids, several per sentence, a
phrase's tokens contiguous), unless one cannot fit in the output limit.

It is dynamic beam allocation (Post & Vilar, 2018, *Fast Lexically
Constrained Decoding with Dynamic Beam Allocation*), vectorized as Hu et
al. (2019) do it, as a selection rule of the search loop
(``keras_transformer.search.skeleton``) built on the paper's beam
(``one_beam.OneBeam``, with whichever length penalty and emission the
search uses):

- **State.** Each hypothesis records which constraint tokens it has met
  and, inside a phrase, the position of the phrase's next token. A token
  that breaks off a phrase unmeets the phrase's tokens met so far (the
  phrase must be contiguous).
- **Candidates.** Each step considers the ``K`` best extensions of the
  beam, each hypothesis' own best, and, for each unfinished hypothesis,
  every token that would meet a constraint: the next token of its phrase,
  or else the first token of each unmet phrase. Duplicates count once.
- **Banks.** Candidates are grouped by the number of constraint tokens
  they have met. The beam is filled bank by bank in stripes: the best of
  each bank, the most advanced bank first, then the second best of each,
  and so on, so that hypotheses that have met fewer constraints, but may
  yet meet them all, keep places in the beam.
- **The end.** An unfinished hypothesis may not produce the end token
  before it has met every constraint, except at its output limit. The
  output is ranked by constraint tokens met, then by score; a row is done
  when its whole beam is finished, or (``top_n``) when its ``top_n`` best
  finished hypotheses that meet every constraint cannot be overtaken (the
  bound of ``one_beam``).

Constraints arrive as three ``(B, C)`` int arrays (``constraint_arrays``):
the tokens (``-1`` where a row has fewer than ``C``), the position of each
token's phrase start, and of the next token of its phrase (``-1`` at a
phrase's end). ``C`` is bucketed (``shapes.constraint_width``) so that a
new glossary rarely means a new compilation.
"""

import numpy as np
from keras import ops

from keras_transformer.search.emission import IMPOSSIBLE
from keras_transformer.search.one_beam import OneBeam

# A sort key larger than any candidate's: the stripe (< 2^14) times the banks.
_LAST = 1e9


def constraint_arrays(constraints, rows, width):
    """``(tokens, starts, nexts)``, each ``(rows, width)`` int32, from one
    list of phrases (lists of ids) per row (rows beyond ``constraints``
    have none)."""
    tokens = np.full((rows, width), -1, "int32")
    starts = np.zeros((rows, width), "int32")
    nexts = np.full((rows, width), -1, "int32")
    for row, phrases in enumerate(constraints):
        position = 0
        for phrase in phrases:
            first = position
            for n, token in enumerate(phrase):
                tokens[row, position] = token
                starts[row, position] = first
                if n + 1 < len(phrase):
                    nexts[row, position] = position + 1
                position += 1
    return tokens, starts, nexts


class ConstrainedBeam(OneBeam):
    """Carry: ``(OneBeam's carry, met (B, K, C), pending (B, K))``; the result
    is ``(output, scores, log P)``, each row's hypotheses ranked by
    constraint tokens met, then score.

    Args:
        constraints: ``(tokens, starts, nexts)`` tensors (the module's
            docstring); the rest as for ``OneBeam``.
    """

    def __init__(self, *args, constraints, **kwargs):
        super().__init__(*args, **kwargs)
        self.tokens, self.starts, self.nexts = (
            ops.cast(x, "int32") for x in constraints
        )
        self.width = ops.shape(self.tokens)[1]
        positions = ops.arange(self.width, dtype="int32")
        given = ops.greater_equal(self.tokens, 0)
        self.first = ops.logical_and(ops.equal(self.starts, positions[None]), given)
        self.total = ops.sum(ops.cast(given, "int32"), axis=1)  # (B,)

    def start(self, rows, max_length):
        k, c = self.beam_size, self.width
        return (
            super().start(rows, max_length),
            ops.zeros((rows, k, c), "bool"),
            ops.full((rows, k), -1, "int32"),
        )

    def open(self, carry):
        return super().open(carry[0])

    def advance(self, met, pending, token):
        """``(met, pending)`` after ``token``: ``met`` ``(B, M, C)``,
        ``pending`` and ``token`` ``(B, M)``."""
        positions = ops.arange(self.width, dtype="int32")[None, None, :]
        in_phrase = ops.greater_equal(pending, 0)
        p = ops.maximum(pending, 0)
        continues = ops.logical_and(
            in_phrase, ops.equal(token, ops.take_along_axis(self.tokens, p, axis=1))
        )
        # A phrase broken off loses what it had met: it must be contiguous.
        phrase_start = ops.take_along_axis(self.starts, p, axis=1)[..., None]
        unwind = ops.logical_and(
            ops.logical_and(in_phrase, ops.logical_not(continues))[..., None],
            ops.logical_and(positions >= phrase_start, positions < p[..., None]),
        )
        met = ops.logical_and(met, ops.logical_not(unwind))
        met = ops.logical_or(
            met, ops.logical_and(continues[..., None], positions == p[..., None])
        )
        pending = ops.where(continues, ops.take_along_axis(self.nexts, p, axis=1), -1)
        # Otherwise the token may open the first unmet phrase it starts.
        opens = ops.logical_and(
            ops.logical_and(ops.logical_not(continues)[..., None], self.first[:, None]),
            ops.logical_and(
                ops.logical_not(met), ops.equal(self.tokens[:, None], token[..., None])
            ),
        )
        opened = ops.any(opens, axis=-1)
        first = ops.min(ops.where(opens, positions, self.width), axis=-1)
        first = ops.minimum(first, self.width - 1)
        met = ops.logical_or(
            met, ops.logical_and(opened[..., None], positions == first[..., None])
        )
        pending = ops.where(
            opened, ops.take_along_axis(self.nexts, first, axis=1), pending
        )
        return met, pending

    def select(self, carry, log_probs, index):
        beam, met, pending = carry
        finished = beam[3]
        rows, k = ops.shape(finished)[0], self.beam_size
        log_probs = ops.reshape(log_probs, (rows, k, ops.shape(log_probs)[-1]))
        log_probs = self.no_early_end(log_probs, met, index)
        candidates, ranking, candidate_lengths = self.candidates(beam, log_probs, index)
        vocab = ops.shape(candidates)[-1]
        flat_ranking = ops.reshape(ranking, (rows, k * vocab))
        flat_log_probs = ops.reshape(candidates, (rows, k * vocab))
        flat, valid = self.proposals(flat_ranking, ranking, met, pending, finished)
        cand_log_probs = ops.take_along_axis(flat_log_probs, flat, axis=1)
        valid = ops.logical_and(valid, cand_log_probs > IMPOSSIBLE / 2)
        valid = ops.logical_and(valid, ops.logical_not(_repeats(flat, valid)))
        parents = flat // vocab
        chosen = ops.cast(flat % vocab, "int32")
        # Each candidate's constraint state; a finished parent's is kept.
        parent_finished = ops.take_along_axis(finished, parents, axis=1)
        parent_met = ops.take_along_axis(met, parents[:, :, None], axis=1)
        parent_pending = ops.take_along_axis(pending, parents, axis=1)
        new_met, new_pending = self.advance(parent_met, parent_pending, chosen)
        new_met = ops.where(parent_finished[..., None], parent_met, new_met)
        new_pending = ops.where(parent_finished, parent_pending, new_pending)
        banks = ops.sum(ops.cast(new_met, "int32"), axis=-1)
        order = self.stripes(
            ops.take_along_axis(flat_ranking, flat, axis=1), banks, valid
        )
        kept_log_probs = ops.where(
            ops.take_along_axis(valid, order, axis=1),
            ops.take_along_axis(cand_log_probs, order, axis=1),
            IMPOSSIBLE,
        )
        beam, parents, chosen = self.keep(
            beam,
            ops.take_along_axis(parents, order, axis=1),
            ops.take_along_axis(chosen, order, axis=1),
            kept_log_probs,
            candidate_lengths,
            index,
        )
        met = ops.take_along_axis(new_met, order[:, :, None], axis=1)
        pending = ops.take_along_axis(new_pending, order, axis=1)
        output, beam_log_probs, lengths, finished, done = beam
        done = ops.logical_or(done, self.settled_met(beam, met))
        beam = (output, beam_log_probs, lengths, finished, done)
        return (beam, met, pending), parents, chosen

    def no_early_end(self, log_probs, met, index):
        """``(B, K, V)`` log-probabilities where a hypothesis that has not met
        every constraint may not end, except at its limit."""
        if self.ids.end is None:
            return log_probs
        unmet = ops.logical_not(self.met_all(met))
        early = ops.logical_and(unmet, ops.less(index + 1, self.limits))
        is_end = ops.equal(ops.arange(ops.shape(log_probs)[-1]), self.ids.end)
        return ops.where(
            ops.logical_and(early[:, :, None], is_end[None, None, :]),
            IMPOSSIBLE,
            log_probs,
        )

    def proposals(self, flat_ranking, ranking, met, pending, finished):
        """``(B, M)`` candidates as flat indices ``parent * V + token``, and
        whether each may be taken: the K best, each hypothesis' best, and
        the tokens that meet a constraint."""
        rows, k, vocab = ops.shape(ranking)
        _, best = ops.top_k(flat_ranking, k)
        hypotheses = ops.arange(k, dtype="int32")[None, :, None] * vocab
        own_best = hypotheses[:, :, 0] + ops.cast(ops.argmax(ranking, axis=-1), "int32")
        positions = ops.arange(self.width, dtype="int32")[None, None, :]
        pend = pending[:, :, None]
        wanted = ops.where(
            pend >= 0,
            ops.equal(positions, pend),
            ops.logical_and(self.first[:, None], ops.logical_not(met)),
        )
        wanted = ops.logical_and(wanted, ops.logical_not(finished)[:, :, None])
        meeting = hypotheses + ops.maximum(self.tokens, 0)[:, None, :]
        flat = ops.concatenate(
            [
                ops.cast(best, "int32"),
                ops.reshape(meeting, (rows, -1)),
                own_best,
            ],
            axis=1,
        )
        valid = ops.concatenate(
            [
                ops.ones((rows, k), "bool"),
                ops.reshape(wanted, (rows, -1)),
                ops.ones((rows, k), "bool"),
            ],
            axis=1,
        )
        return flat, valid

    def stripes(self, ranking, banks, valid):
        """``(B, K)``: the candidates kept, in stripes over the banks."""
        earlier = _earlier(ops.shape(ranking)[1])
        better = _before(ranking[:, None, :], ranking[:, :, None], earlier)
        same_bank = ops.equal(banks[:, None, :], banks[:, :, None])
        ahead = ops.logical_and(ops.logical_and(better, same_bank), valid[:, None, :])
        stripe = ops.sum(ops.cast(ahead, "int32"), axis=-1)
        key = stripe * (self.width + 1) + (self.width - banks)
        key = ops.where(valid, ops.cast(key, "float32"), _LAST)
        _, order = ops.top_k(-key, self.beam_size)
        return order

    def met_all(self, met):
        return ops.greater_equal(
            ops.sum(ops.cast(met, "int32"), axis=-1), self.total[:, None]
        )

    def settled_met(self, beam, met):
        """``(B,)``: the whole beam finished, or ``top_n`` finished
        hypotheses that meet every constraint and that no unfinished one
        can overtake."""
        _, log_probs, lengths, finished, _ = beam
        scores = log_probs / self.penalty(ops.cast(lengths, "float32"), self.alpha)
        good = ops.logical_and(finished, self.met_all(met))
        ranked, _ = ops.top_k(ops.where(good, scores, IMPOSSIBLE), self.beam_size)
        nth_index = ops.convert_to_tensor(self.top_n, "int32") - 1
        nth = ops.take(ranked, nth_index, axis=1)
        enough = ops.sum(ops.cast(good, "int32"), axis=1) > nth_index
        best_open = ops.max(ops.where(finished, IMPOSSIBLE, log_probs), axis=1)
        return ops.logical_or(
            ops.all(finished, axis=1),
            ops.logical_and(enough, nth >= best_open / self.final_penalty),
        )

    def result(self, carry):
        beam, met, _ = carry
        output, scores, log_probs = super().result(beam)
        met_count = ops.sum(ops.cast(met, "int32"), axis=-1)
        earlier = _earlier(self.beam_size)
        ahead = _before(
            met_count[:, None, :],
            met_count[:, :, None],
            _before(scores[:, None, :], scores[:, :, None], earlier),
        )
        place = ops.sum(ops.cast(ahead, "int32"), axis=-1)
        _, order = ops.top_k(-ops.cast(place, "float32"), self.beam_size)
        return (
            ops.take_along_axis(output, order[:, :, None], axis=1),
            ops.take_along_axis(scores, order, axis=1),
            ops.take_along_axis(log_probs, order, axis=1),
        )


def _repeats(flat, valid):
    """``(B, M)``: True where an earlier valid candidate is the same one."""
    same = ops.equal(flat[:, :, None], flat[:, None, :])
    earlier = _earlier(ops.shape(flat)[1])
    return ops.any(
        ops.logical_and(ops.logical_and(same, earlier), valid[:, None, :]), axis=-1
    )


def _earlier(m):
    """``(1, M, M)``: True at ``[i, i']`` where ``i' < i``."""
    index = ops.arange(m, dtype="int32")
    return index[None, None, :] < index[None, :, None]


def _before(a, b, tie):
    """``a > b``, or ``tie`` where they are equal: a lexicographic order built
    one key at a time."""
    return ops.logical_or(a > b, ops.logical_and(a == b, tie))
