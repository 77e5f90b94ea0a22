"""The searches know a model only through ``encode``, ``initial_cache``,
``decode_step`` (cached) and ``decode`` (uncached), and take the special ids
as arguments: a model of one's own, with ids of its own, can be searched."""

import numpy as np
import pytest
from keras import ops

from keras_transformer.search import decoding

START, END, PAD = 7, 8, 9
VOCAB = 20


class CopyModel:
    """Not a Transformer: a rule. The next token is the source token at the
    same position, then ``END``. It also gives its largest logits to
    ``START`` and ``PAD``, which a search must never generate."""

    def encode(self, source_ids):
        source_ids = ops.convert_to_tensor(source_ids, "int32")
        return source_ids, ops.not_equal(source_ids, PAD)

    def _logits(self, source, mask, index):
        """(B, V) logits at position ``index`` (a scalar tensor)."""
        columns = ops.arange(ops.shape(source)[1])
        here = ops.equal(columns, index)[None, :]
        inside = ops.any(ops.logical_and(here, mask), axis=1)  # (B,)
        token = ops.sum(ops.where(here, source, 0), axis=1)
        token = ops.where(inside, token, END)
        logits = 10.0 * ops.one_hot(token, VOCAB)
        banned = ops.logical_or(
            ops.equal(ops.arange(VOCAB), START), ops.equal(ops.arange(VOCAB), PAD)
        )
        return ops.where(banned, 100.0, logits)

    def initial_cache(self, encoder_outputs, max_length):
        # The state of the rule: how many tokens each row has read.
        rows = ops.shape(encoder_outputs)[0]
        return ops.zeros((rows,), "int32"), encoder_outputs

    def decode_step(self, token_ids, index, self_cache, cross_cache, encoder_mask):
        logits = self._logits(cross_cache, encoder_mask, index)
        return logits, self_cache + 1

    def decode(self, decoder_inputs, encoder_outputs, encoder_mask):
        length = ops.shape(decoder_inputs)[1]
        return ops.stack(
            [self._logits(encoder_outputs, encoder_mask, t) for t in range(length)],
            axis=1,
        )


SOURCES = np.array(
    [[10, 11, 12, PAD, PAD], [13, 14, 15, 16, 17], [18, PAD, PAD, PAD, PAD]], "int32"
)
EXPECTED = np.array(
    [
        [10, 11, 12, END, PAD, PAD, PAD],
        [13, 14, 15, 16, 17, END, PAD],
        [18, END, PAD, PAD, PAD, PAD, PAD],
    ],
    "int32",
)
IDS = dict(start_id=START, end_id=END, pad_id=PAD)


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_search_of_a_model_of_ones_own(use_cache):
    tokens, scores = decoding.greedy_search(
        CopyModel(), SOURCES, 7, use_cache=use_cache, **IDS
    )
    np.testing.assert_array_equal(tokens, EXPECTED)
    assert np.all(scores < 0) and np.all(np.isfinite(scores))


def test_beam_search_of_a_model_of_ones_own():
    tokens, scores, _ = decoding.beam_search(CopyModel(), SOURCES, 7, 3, **IDS)
    np.testing.assert_array_equal(tokens[:, 0], EXPECTED)
    assert np.all(scores[:, 0] >= scores[:, 1])
    assert not np.isin(tokens, [START]).any()


def test_special_ids_must_be_ints():
    with pytest.raises(TypeError, match="start_id must be an int"):
        decoding.greedy_search(CopyModel(), SOURCES, 7, start_id="7")
