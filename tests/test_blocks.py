"""EncoderBlock and DecoderBlock (paper §3.1) against a NumPy reference.

Expected values come from `tests/numpy_reference.py` (float64, written from the
paper's equations); the blocks' weights are randomised (kernels, biases and
LayerNorm gamma/beta) so that every parameter takes part. Runs under every
KERAS_BACKEND.
"""

import re

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from tests import numpy_reference as ref
from tests.layer_checks import MaskProbe, run_layer_test

D_MODEL, HEADS, D_FF = 16, 4, 32
B, T, S = 3, 6, 7  # batch, target length, source length
VOCAB = 20
EPS = 1e-6  # the blocks' default layer_norm_epsilon
ATOL = RTOL = 1e-5


def _np(x):
    return np.asarray(ops.convert_to_numpy(x), dtype=np.float64)


def _encoder(**kwargs):
    kwargs.setdefault("dropout", 0.1)
    return kt.EncoderBlock(d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF, **kwargs)


def _decoder(**kwargs):
    kwargs.setdefault("dropout", 0.1)
    return kt.DecoderBlock(d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF, **kwargs)


def _randomize(layer, rng):
    """Random values for every weight, so biases, gamma and beta all matter."""
    assert layer.weights
    for variable in layer.weights:
        shape = tuple(variable.shape)
        if variable.name == "gamma":
            value = 1.0 + 0.2 * rng.standard_normal(shape)
        elif variable.name in ("beta", "bias"):
            value = 0.2 * rng.standard_normal(shape)
        else:
            assert variable.name == "kernel", variable.path
            value = rng.standard_normal(shape) / np.sqrt(shape[0])
        variable.assign(value.astype("float32"))


def _padding_mask(rng, batch, length):
    """(batch, length) bool: row 0 has random holes, row 1 trailing padding,
    the rest random; position 0 is always a real token."""
    mask = rng.random((batch, length)) < 0.6
    mask[1] = np.arange(length) < length // 2
    mask[:, 0] = True
    assert not mask.all()
    return mask


def _ids(rng, mask):
    return (rng.integers(1, VOCAB, mask.shape) * mask).astype("int32")


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


def _assert_valid_rows_close(actual, expected, valid, atol=ATOL, rtol=RTOL):
    """Compare at real (non-padded) query positions; padded ones only finite."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape
    assert np.isfinite(actual).all()
    np.testing.assert_allclose(actual[valid], expected[valid], atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------
# Against the NumPy reference, with explicit and with Keras (implicit) masks
# ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_encoder_block_matches_reference(norm_first, rng):
    mask = _padding_mask(rng, B, T)
    ids = _ids(rng, mask)
    block = _encoder(norm_first=norm_first)

    # Implicit: the block gets the Embedding's Keras mask in a functional model.
    ids_in = keras.Input((T,), batch_size=B, dtype="int32")
    embedded = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(ids_in)
    model = keras.Model(ids_in, [embedded, block(embedded)])
    _randomize(block, rng)
    x, implicit = model(ids, training=False)
    x = _np(x)

    # Explicit: a plain array and mask=.
    explicit = _np(block(x, mask=mask, training=False))

    weights = ref.block_weights(block)
    expected = ref.encoder_block(
        x, weights, HEADS, pad_mask=mask, norm_first=norm_first, eps=EPS
    )
    _assert_valid_rows_close(explicit, expected, mask)
    _assert_valid_rows_close(_np(implicit), expected, mask)
    np.testing.assert_allclose(_np(implicit), explicit, atol=1e-6, rtol=1e-6)

    # The data exercise the mask: ignoring it gives other values.
    unmasked = ref.encoder_block(x, weights, HEADS, norm_first=norm_first, eps=EPS)
    assert not np.allclose(unmasked[mask], expected[mask], atol=1e-3)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_decoder_block_matches_reference(norm_first, rng):
    dec_mask = _padding_mask(rng, B, T)
    enc_mask = _padding_mask(rng, B, S)
    tgt_ids, src_ids = _ids(rng, dec_mask), _ids(rng, enc_mask)
    block = _decoder(norm_first=norm_first)

    # Implicit: both masks come from Embedding(mask_zero=True) in a functional
    # model (the source embedding stands in for the encoder output).
    tgt_in = keras.Input((T,), batch_size=B, dtype="int32")
    src_in = keras.Input((S,), batch_size=B, dtype="int32")
    y_sym = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(tgt_in)
    mem_sym = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(src_in)
    model = keras.Model([tgt_in, src_in], [y_sym, mem_sym, block(y_sym, mem_sym)])
    _randomize(block, rng)
    y, memory, implicit = model([tgt_ids, src_ids], training=False)
    y, memory = _np(y), _np(memory)

    explicit = _np(
        block(
            y,
            memory,
            decoder_sequence_mask=dec_mask,
            encoder_sequence_mask=enc_mask,
            training=False,
        )
    )

    weights = ref.block_weights(block)
    expected = ref.decoder_block(
        y,
        memory,
        weights,
        HEADS,
        dec_mask=dec_mask,
        enc_mask=enc_mask,
        norm_first=norm_first,
        eps=EPS,
    )
    _assert_valid_rows_close(explicit, expected, dec_mask)
    _assert_valid_rows_close(_np(implicit), expected, dec_mask)
    np.testing.assert_allclose(_np(implicit), explicit, atol=1e-6, rtol=1e-6)

    # The data exercise both masks and causality.
    for kwargs in (
        {"dec_mask": dec_mask},  # encoder mask ignored
        {"enc_mask": enc_mask},  # decoder mask ignored
        {"dec_mask": dec_mask, "enc_mask": enc_mask, "causal": False},
    ):
        other = ref.decoder_block(
            y, memory, weights, HEADS, norm_first=norm_first, eps=EPS, **kwargs
        )
        assert not np.allclose(other[dec_mask], expected[dec_mask], atol=1e-3), kwargs


# ---------------------------------------------------------------------------
# Decoder: the cross-attention is masked by the ENCODER's padding
# ---------------------------------------------------------------------------
def test_decoder_cross_attention_uses_encoder_padding_mask(rng):
    dec_mask = _padding_mask(rng, B, T)
    enc_mask = _padding_mask(rng, B, S)
    y, memory = _normal(rng, B, T, D_MODEL), _normal(rng, B, S, D_MODEL)
    block = _decoder()

    def run(mem):
        return _np(
            block(
                y,
                mem,
                decoder_sequence_mask=dec_mask,
                encoder_sequence_mask=enc_mask,
                training=False,
            )
        )

    base = run(memory)
    _randomize(block, rng)
    base = run(memory)

    # New values at padded source positions: no change at any real query.
    changed_padding = memory.copy()
    changed_padding[~enc_mask] = 10 * _normal(rng, int((~enc_mask).sum()), D_MODEL)
    np.testing.assert_allclose(
        run(changed_padding)[dec_mask], base[dec_mask], atol=ATOL, rtol=RTOL
    )

    # New values at real source positions: every real query changes.
    changed_valid = memory.copy()
    changed_valid[enc_mask] = _normal(rng, int(enc_mask.sum()), D_MODEL)
    diff = np.abs(run(changed_valid) - base).max(axis=-1)  # (B, T)
    assert (diff[dec_mask] > 1e-3).all(), diff


# ---------------------------------------------------------------------------
# Decoder: causality
# ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("with_padding", [False, True], ids=["no_padding", "padding"])
@pytest.mark.parametrize(
    "return_scores", [False, True], ids=["fused_path", "explicit_path"]
)
def test_decoder_is_causal(with_padding, return_scores, rng):
    y, memory = _normal(rng, B, T, D_MODEL), _normal(rng, B, S, D_MODEL)
    dec_mask = _padding_mask(rng, B, T) if with_padding else None
    block = _decoder()

    def run(target):
        out = block(
            target,
            memory,
            decoder_sequence_mask=dec_mask,
            return_attention_scores=return_scores,
            training=False,
        )
        return _np(out[0] if return_scores else out)

    run(y)
    _randomize(block, rng)
    base = run(y)
    valid = np.ones((B, T), bool) if dec_mask is None else dec_mask
    for t in range(T - 1):
        changed = y.copy()
        changed[:, t + 1 :] = _normal(rng, B, T - t - 1, D_MODEL)
        out = run(changed)
        # Real positions <= t see nothing of positions > t. (A padded query
        # has every key masked; its row becomes a uniform average over all
        # keys, future ones included, so only real positions are checked.)
        np.testing.assert_allclose(
            out[:, : t + 1][valid[:, : t + 1]],
            base[:, : t + 1][valid[:, : t + 1]],
            atol=ATOL,
            rtol=RTOL,
            err_msg=f"t={t}",
        )
        # ... while the changed real positions themselves do change.
        diff = np.abs(out - base).max(axis=-1)[:, t + 1 :]
        assert (diff[valid[:, t + 1 :]] > 1e-3).all(), (t, diff)


# ---------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------
def _call_block(kind, block, x, memory, training):
    if kind == "encoder":
        return _np(block(x, training=training))
    return _np(block(x, memory, training=training))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize(
    "rates",
    [{"dropout": 0.5}, {"dropout": 0.0, "attention_dropout": 0.5}],
    ids=["residual_dropout", "attention_dropout"],
)
def test_dropout_active_only_in_training(kind, rates, rng):
    x, memory = _normal(rng, B, T, D_MODEL), _normal(rng, B, S, D_MODEL)
    block = (_encoder if kind == "encoder" else _decoder)(**rates)
    first = _call_block(kind, block, x, memory, True)
    second = _call_block(kind, block, x, memory, True)
    inference = _call_block(kind, block, x, memory, False)
    assert np.isfinite(first).all() and np.isfinite(second).all()
    assert not np.allclose(first, second, atol=1e-3)
    assert not np.allclose(first, inference, atol=1e-3)
    np.testing.assert_array_equal(_call_block(kind, block, x, memory, False), inference)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_no_dropout_means_training_changes_nothing(kind, rng):
    x, memory = _normal(rng, B, T, D_MODEL), _normal(rng, B, S, D_MODEL)
    block = (_encoder if kind == "encoder" else _decoder)(
        dropout=0.0, attention_dropout=0.0
    )
    inference = _call_block(kind, block, x, memory, False)
    np.testing.assert_array_equal(_call_block(kind, block, x, memory, True), inference)
    np.testing.assert_array_equal(_call_block(kind, block, x, memory, True), inference)


# ---------------------------------------------------------------------------
# return_attention_scores
# ---------------------------------------------------------------------------
def test_encoder_returns_attention_weights(rng):
    mask = _padding_mask(rng, B, T)
    x = _normal(rng, B, T, D_MODEL)
    block = _encoder()
    block(x, mask=mask)
    _randomize(block, rng)
    out, weights = block(x, mask=mask, return_attention_scores=True, training=False)
    out, weights = _np(out), _np(weights)
    assert weights.shape == (B, HEADS, T, T)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)

    expected_out, expected_w = ref.encoder_block(
        x,
        ref.block_weights(block),
        HEADS,
        pad_mask=mask,
        eps=EPS,
        return_attention_scores=True,
    )
    rows = np.broadcast_to(mask[:, None, :], weights.shape[:-1])  # real queries
    _assert_valid_rows_close(weights, expected_w, rows)
    _assert_valid_rows_close(out, expected_out, mask)
    # No weight on padded keys, from any real query.
    padded_key = np.broadcast_to(~mask[:, None, None, :], weights.shape)
    assert np.all(weights[padded_key & rows[..., None]] == 0.0)
    # Same output as the call without scores (the fused-kernel path).
    np.testing.assert_allclose(
        out[mask], _np(block(x, mask=mask, training=False))[mask], atol=ATOL, rtol=RTOL
    )


def test_decoder_returns_self_and_cross_attention_weights(rng):
    dec_mask = _padding_mask(rng, B, T)
    enc_mask = _padding_mask(rng, B, S)
    y, memory = _normal(rng, B, T, D_MODEL), _normal(rng, B, S, D_MODEL)
    block = _decoder()
    kwargs = {
        "decoder_sequence_mask": dec_mask,
        "encoder_sequence_mask": enc_mask,
        "training": False,
    }
    block(y, memory, **kwargs)
    _randomize(block, rng)
    out, scores = block(y, memory, return_attention_scores=True, **kwargs)
    assert isinstance(scores, tuple) and len(scores) == 2
    self_w, cross_w = _np(scores[0]), _np(scores[1])
    out = _np(out)
    assert self_w.shape == (B, HEADS, T, T)
    assert cross_w.shape == (B, HEADS, T, S)
    np.testing.assert_allclose(self_w.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(cross_w.sum(-1), 1.0, atol=1e-5)

    expected_out, (expected_self, expected_cross) = ref.decoder_block(
        y,
        memory,
        ref.block_weights(block),
        HEADS,
        dec_mask=dec_mask,
        enc_mask=enc_mask,
        eps=EPS,
        return_attention_scores=True,
    )
    rows = np.broadcast_to(dec_mask[:, None, :], (B, HEADS, T))  # real queries
    _assert_valid_rows_close(self_w, expected_self, rows)
    _assert_valid_rows_close(cross_w, expected_cross, rows)
    _assert_valid_rows_close(out, expected_out, dec_mask)

    # From real queries: nothing above the diagonal, nothing on padded keys.
    future = np.triu(np.ones((T, T), bool), k=1)
    forbidden_self = (future[None, None] | ~dec_mask[:, None, None, :]) & rows[
        ..., None
    ]
    assert np.all(self_w[forbidden_self] == 0.0)
    forbidden_cross = ~enc_mask[:, None, None, :] & rows[..., None]
    assert np.all(cross_w[np.broadcast_to(forbidden_cross, cross_w.shape)] == 0.0)
    # Same output as the call without scores (the fused-kernel path).
    np.testing.assert_allclose(
        out[dec_mask], _np(block(y, memory, **kwargs))[dec_mask], atol=ATOL, rtol=RTOL
    )


# ---------------------------------------------------------------------------
# Keras masks propagate through the blocks
# ---------------------------------------------------------------------------
def test_encoder_passes_keras_mask_on(rng):
    ids = _ids(rng, _padding_mask(rng, B, T))
    ids_in = keras.Input((T,), batch_size=B, dtype="int32")
    x = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(ids_in)
    model = keras.Model(ids_in, MaskProbe()(_encoder()(x)))
    np.testing.assert_array_equal(_np(model(ids)), (ids != 0).astype("float64"))


def test_decoder_passes_decoder_keras_mask_on(rng):
    tgt_ids = _ids(rng, _padding_mask(rng, B, T))
    src_ids = _ids(rng, _padding_mask(rng, B, S))
    tgt_in = keras.Input((T,), batch_size=B, dtype="int32")
    src_in = keras.Input((S,), batch_size=B, dtype="int32")
    y = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(tgt_in)
    memory = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(src_in)
    model = keras.Model([tgt_in, src_in], MaskProbe()(_decoder()(y, memory)))
    # The output is aligned with the target: it carries the decoder's mask.
    np.testing.assert_array_equal(
        _np(model([tgt_ids, src_ids])), (tgt_ids != 0).astype("float64")
    )


# ---------------------------------------------------------------------------
# Symbolic calls (functional models) with return_attention_scores=True
# ---------------------------------------------------------------------------
def test_encoder_symbolic_call_returns_attention_scores():
    x = keras.Input((T, D_MODEL), batch_size=B)
    result = _encoder()(x, return_attention_scores=True)
    assert isinstance(result, (tuple, list)) and len(result) == 2
    assert tuple(result[0].shape) == (B, T, D_MODEL)
    assert tuple(result[1].shape) == (B, HEADS, T, T)


def test_decoder_symbolic_call_returns_attention_scores():
    y = keras.Input((T, D_MODEL), batch_size=B)
    memory = keras.Input((S, D_MODEL), batch_size=B)
    result = _decoder()(y, memory, return_attention_scores=True)
    assert isinstance(result, (tuple, list)) and len(result) == 2
    out, scores = result
    assert tuple(out.shape) == (B, T, D_MODEL)
    assert [tuple(w.shape) for w in scores] == [(B, HEADS, T, T), (B, HEADS, T, S)]


class _TracedEncoder(kt.EncoderBlock):
    """Keras' default output spec: ``call`` traced on placeholders."""

    compute_output_spec = keras.layers.Layer.compute_output_spec


class _TracedDecoder(kt.DecoderBlock):
    compute_output_spec = keras.layers.Layer.compute_output_spec


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_symbolic_output_equals_traced_output(norm_first, policy):
    """The blocks' shape-only output spec (nothing traced) against Keras'
    default: the same shape, dtype and Keras mask out of a symbolic call,
    with and without masks, with known and unknown lengths and batch."""
    keras.config.set_dtype_policy(policy)
    args = dict(d_model=D_MODEL, num_heads=HEADS, d_ff=D_FF, norm_first=norm_first)
    for batch, t, s in ((B, T, S), (None, None, None)):
        ids = keras.Input((t,), batch_size=batch, dtype="int32")
        x = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(ids)
        memory = keras.Input((s, D_MODEL), batch_size=batch)
        mask = keras.Input((t,), batch_size=batch, dtype="bool")
        memory_mask = keras.Input((s,), batch_size=batch, dtype="bool")
        cases = [
            (kt.EncoderBlock, _TracedEncoder, (x,), {}),
            (kt.EncoderBlock, _TracedEncoder, (memory,), {"mask": memory_mask}),
            (kt.DecoderBlock, _TracedDecoder, (x, memory), {}),
            (
                kt.DecoderBlock,
                _TracedDecoder,
                (keras.Input((t, D_MODEL), batch_size=batch), memory),
                dict(decoder_sequence_mask=mask, encoder_sequence_mask=memory_mask),
            ),
        ]
        for fast_cls, traced_cls, inputs, kwargs in cases:
            block = fast_cls(**args)
            fast = block(*inputs, **kwargs)
            traced = traced_cls(**args)(*inputs, **kwargs)
            assert fast.shape == traced.shape == inputs[0].shape, fast_cls
            # The dtype of a real call's output. (PyTorch's traced spec says
            # float32 for a pre-LN block under mixed_bfloat16, whose real
            # output is bfloat16: a quirk of Keras' placeholders there.)
            real = [
                keras.random.normal((B, T if i == 0 else S, D_MODEL))
                for i in range(len(inputs))
            ]
            expected = keras.backend.standardize_dtype(block(*real).dtype)
            assert fast.dtype == expected, fast_cls
            if not (keras.backend.backend() == "torch" and norm_first):
                assert traced.dtype == expected, fast_cls
            masks = [getattr(out, "_keras_mask", None) for out in (fast, traced)]
            assert [m is None for m in masks] == [m is None for m in masks[::-1]]
            if masks[0] is not None:
                assert masks[0].shape == masks[1].shape
    # The shape checks of ``call`` still apply to symbolic calls.
    with pytest.raises(ValueError, match="same batch size"):
        kt.DecoderBlock(**args)(
            keras.Input((T, D_MODEL), batch_size=2),
            keras.Input((S, D_MODEL), batch_size=3),
        )


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [kt.EncoderBlock, kt.DecoderBlock])
def test_d_model_not_divisible_by_num_heads(cls):
    with pytest.raises(ValueError) as info:
        cls(d_model=30, num_heads=4, d_ff=16)
    message = str(info.value)
    assert re.search(r"\b30\b", message) and re.search(r"\b4\b", message), message


def test_encoder_input_width_must_be_d_model(rng):
    with pytest.raises(ValueError, match="d_model"):
        _encoder()(_normal(rng, B, T, D_MODEL // 2))


@pytest.mark.parametrize("which", ["decoder_sequence", "encoder_sequence"])
def test_decoder_input_widths_must_be_d_model(which, rng):
    y = _normal(rng, B, T, D_MODEL // 2 if which == "decoder_sequence" else D_MODEL)
    memory = _normal(
        rng, B, S, D_MODEL // 2 if which == "encoder_sequence" else D_MODEL
    )
    with pytest.raises(ValueError, match="d_model"):
        _decoder()(y, memory)


def test_decoder_batch_sizes_must_match(rng):
    block = _decoder()
    with pytest.raises(ValueError, match="batch size"):
        block(_normal(rng, 2, T, D_MODEL), _normal(rng, 3, S, D_MODEL))


# ---------------------------------------------------------------------------
# Standard layer checks. Trainable weights, counted from the architecture:
# a multi-head attention has 4 projections (W_Q, W_K, W_V, W_O), each a
# kernel and a bias: 8; a LayerNorm has gamma and beta: 2; the FFN has 2
# dense layers: 4. Encoder: 8 + 2*2 + 4 = 16. Decoder: 2*8 + 3*2 + 4 = 26.
# ---------------------------------------------------------------------------
# One norm_first setting each keeps the suite fast; both are saved, reloaded
# and trained the same way, and get_config carries norm_first either way.
@pytest.mark.slow
def test_encoder_run_layer_test(tmp_path, rng):
    run_layer_test(
        kt.EncoderBlock,
        init_kwargs={
            "d_model": D_MODEL,
            "num_heads": HEADS,
            "d_ff": D_FF,
            "dropout": 0.1,
            "norm_first": False,
        },
        input_data={"inputs": _normal(rng, 2, 5, D_MODEL)},
        expected_output_shape=(2, 5, D_MODEL),
        expected_num_trainable_weights=16,
        tmp_path=tmp_path,
    )


@pytest.mark.slow
def test_decoder_run_layer_test(tmp_path, rng):
    run_layer_test(
        kt.DecoderBlock,
        init_kwargs={
            "d_model": D_MODEL,
            "num_heads": HEADS,
            "d_ff": D_FF,
            "dropout": 0.1,
            "norm_first": True,
        },
        input_data={
            "decoder_sequence": _normal(rng, 2, 5, D_MODEL),
            "encoder_sequence": _normal(rng, 2, 7, D_MODEL),
        },
        expected_output_shape=(2, 5, D_MODEL),
        expected_num_trainable_weights=26,
        tmp_path=tmp_path,
    )
