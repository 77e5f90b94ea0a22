"""Greedy search as a selection rule of the search loop
(``keras_transformer.search.skeleton``): the most probable next token at
every step, one hypothesis per row."""

from keras import ops

from keras_transformer.search.skeleton import at_column, stops


class Greedy:
    """Carry: ``(output (B, T), log P (B,), done (B,))``; the result is
    ``(output, log P)``."""

    beam_size = 1

    def __init__(self, max_lengths, max_length, ids):
        self.max_lengths = max_lengths
        self.columns = ops.arange(max_length)
        self.ids = ids

    def start(self, rows, max_length):
        return (
            ops.full((rows, max_length), self.ids.pad, "int32"),
            ops.zeros((rows,), "float32"),
            ops.less_equal(self.max_lengths, 0),
        )

    def open(self, carry):
        return ops.logical_not(ops.all(carry[2]))

    def select(self, carry, log_probs, index):
        output, scores, done = carry
        chosen = ops.cast(ops.argmax(log_probs, axis=-1), "int32")
        chosen = ops.where(done, self.ids.pad, chosen)
        gain = ops.take_along_axis(log_probs, chosen[:, None], axis=1)[:, 0]
        scores = scores + ops.where(done, 0.0, gain)
        output = ops.where(at_column(self.columns, index), chosen[:, None], output)
        done = ops.logical_or(
            done, stops(chosen, index, self.max_lengths, self.ids.end)
        )
        return (output, scores, done), None, chosen

    def result(self, carry):
        return carry[0], carry[1]
