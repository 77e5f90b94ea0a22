"""ScaledDotProductAttention and MultiHeadAttention against the paper's equations."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from tests.layer_checks import run_layer_test
from tests.numpy_reference import scaled_dot_product_attention as np_attention


def _np(x):
    return ops.convert_to_numpy(x)


def _random_mask(rng, shape, p=0.7):
    mask = rng.random(shape) < p
    mask[..., 0] = True  # keep one key per row: fully masked rows are tested apart
    return mask


# --------------------------------------------------------------------------
# ScaledDotProductAttention
# --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("return_scores", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize(
    "batch_shape", [(), (3,), (2, 3)], ids=["rank2", "rank3", "rank4"]
)
@pytest.mark.parametrize("masking", ["none", "padding", "random", "causal", "both"])
def test_sdpa_matches_numpy(rng, return_scores, batch_shape, masking):
    t_q = t_k = 5
    q = rng.normal(size=batch_shape + (t_q, 8)).astype("float32")
    k = rng.normal(size=batch_shape + (t_k, 8)).astype("float32")
    v = rng.normal(size=batch_shape + (t_k, 6)).astype("float32")
    mask = None
    if masking == "padding":  # (..., 1, T_k), broadcast over queries
        mask = _random_mask(rng, batch_shape + (1, t_k))
    elif masking in ("random", "both"):
        mask = _random_mask(rng, batch_shape + (t_q, t_k))
    is_causal = masking in ("causal", "both")

    full_mask = np.ones(batch_shape + (t_q, t_k), bool) if mask is None else mask
    if is_causal:
        full_mask = full_mask & np.tril(np.ones((t_q, t_k), bool))
    expected_out, expected_w = np_attention(q, k, v, full_mask)

    layer = kt.ScaledDotProductAttention()
    result = layer(
        q, k, v, mask=mask, is_causal=is_causal, return_attention_scores=return_scores
    )
    out = result[0] if return_scores else result
    assert out.shape == batch_shape + (t_q, 6)
    np.testing.assert_allclose(_np(out), expected_out, atol=2e-5, rtol=1e-5)
    if return_scores:
        np.testing.assert_allclose(_np(result[1]), expected_w, atol=2e-6)


@pytest.mark.parametrize("return_scores", [False, True])
def test_sdpa_causal_is_aligned_to_the_last_key(rng, return_scores):
    # Two new queries against a cache of five keys: query i sits at
    # position 3 + i and may see keys 0 .. 3 + i.
    q = rng.normal(size=(2, 2, 4)).astype("float32")
    k = rng.normal(size=(2, 5, 4)).astype("float32")
    v = rng.normal(size=(2, 5, 4)).astype("float32")
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    expected, _ = np_attention(q, k, v, np.broadcast_to(mask, (2, 2, 5)))
    result = kt.ScaledDotProductAttention()(
        q, k, v, is_causal=True, return_attention_scores=return_scores
    )
    out = result[0] if return_scores else result
    np.testing.assert_allclose(_np(out), expected, atol=2e-5)


@pytest.mark.parametrize("return_scores", [False, True])
def test_sdpa_fully_masked_rows_are_finite(rng, return_scores):
    q = rng.normal(size=(2, 4, 8)).astype("float32")
    mask = np.ones((2, 4, 4), bool)
    mask[1] = False  # a sequence that is pure padding
    mask[0, 2] = False  # one query row with nothing to attend to
    result = kt.ScaledDotProductAttention()(
        q, q, q, mask=mask, return_attention_scores=return_scores
    )
    out = _np(result[0] if return_scores else result)
    assert np.isfinite(out).all()
    expected, _ = np_attention(q, q, q, mask)
    np.testing.assert_allclose(out[0, [0, 1, 3]], expected[0, [0, 1, 3]], atol=2e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("return_scores", [False, True])
def test_sdpa_low_precision_fully_masked_rows_are_finite(rng, dtype, return_scores):
    # A fill such as -1e9 would overflow float16 (max 65504) to -inf / NaN.
    q = ops.cast(rng.normal(size=(2, 4, 8)), dtype)
    mask = np.zeros((2, 4, 4), bool)
    mask[0] = True
    layer = kt.ScaledDotProductAttention(dtype=f"mixed_{dtype}")
    result = layer(q, q, q, mask=mask, return_attention_scores=return_scores)
    out = result[0] if return_scores else result
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    assert np.isfinite(_np(ops.cast(out, "float32"))).all()


def _count_fused_calls(monkeypatch):
    calls = []
    original = keras.ops.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("is_causal"))
        return original(*args, **kwargs)

    monkeypatch.setattr(keras.ops, "dot_product_attention", spy)
    return calls


def test_sdpa_uses_the_fused_op_only_without_weights_or_dropout(rng, monkeypatch):
    calls = _count_fused_calls(monkeypatch)
    q = rng.normal(size=(2, 4, 8)).astype("float32")
    kt.ScaledDotProductAttention()(q, q, q, is_causal=True)
    assert calls == [True]  # a bare causal mask stays on the kernel's causal path
    kt.ScaledDotProductAttention()(q, q, q, return_attention_scores=True)
    kt.ScaledDotProductAttention(dropout=0.5)(q, q, q, training=True)
    assert len(calls) == 1
    kt.ScaledDotProductAttention(dropout=0.5)(q, q, q, training=False)
    assert len(calls) == 2


@pytest.mark.slow
def test_sdpa_attention_dropout(rng):
    q = rng.normal(size=(2, 6, 8)).astype("float32")
    layer = kt.ScaledDotProductAttention(dropout=0.5)
    out_eval = _np(layer(q, q, q, training=False))
    out_train, weights = layer(q, q, q, training=True, return_attention_scores=True)
    expected, expected_w = np_attention(q, q, q, None)
    np.testing.assert_allclose(out_eval, expected, atol=2e-5)
    # The weights returned are the softmax itself; dropout acts on their use.
    np.testing.assert_allclose(_np(weights), expected_w, atol=2e-6)
    assert not np.allclose(_np(out_train), expected, atol=1e-3)


def test_sdpa_rejects_bad_arguments(rng):
    with pytest.raises(ValueError, match=r"dropout=1\.5"):
        kt.ScaledDotProductAttention(dropout=1.5)
    q = rng.normal(size=(2, 4, 8)).astype("float32")
    with pytest.raises(ValueError, match="same rank, 2 to 4"):
        kt.ScaledDotProductAttention()(q, q[0], q)


def test_sdpa_layer_checks(rng, tmp_path):
    q = rng.normal(size=(2, 4, 8)).astype("float32")
    run_layer_test(
        kt.ScaledDotProductAttention,
        {"dropout": 0.1},
        {"query": q, "key": q, "value": q},
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=0,
        call_kwargs={"is_causal": True},
        tmp_path=tmp_path,
        # No weights to train: a fit step would test nothing of this layer.
        run_training_check=False,
    )


# --------------------------------------------------------------------------
# MultiHeadAttention
# --------------------------------------------------------------------------


def _np_mha(layer, query, value, mask):
    """§3.2.2 in NumPy with the layer's own weights."""
    w = {n: _np(getattr(layer, f"{n}_dense").kernel) for n in ("query", "key", "value")}
    b = {n: _np(getattr(layer, f"{n}_dense").bias) for n in ("query", "key", "value")}
    h, d_k = layer.num_heads, layer.d_k
    heads = []
    for i in range(h):
        cols = slice(i * d_k, (i + 1) * d_k)
        q_i = query @ w["query"][:, cols] + b["query"][cols]
        k_i = value @ w["key"][:, cols] + b["key"][cols]
        v_i = value @ w["value"][:, cols] + b["value"][cols]
        heads.append(np_attention(q_i, k_i, v_i, mask))
    concat = np.concatenate([out for out, _ in heads], axis=-1)
    out = concat @ _np(layer.output_dense.kernel) + _np(layer.output_dense.bias)
    return out, np.stack([weights for _, weights in heads], axis=1)


def _padding(rng, batch, length):
    lengths = rng.integers(1, length + 1, size=batch)
    return np.arange(length)[None, :] < lengths[:, None]


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("return_scores", [False, True])
def test_mha_matches_numpy(rng, causal, return_scores):
    batch, t, s, d_model, heads = 3, 5, 5, 16, 4
    query = rng.normal(size=(batch, t, d_model)).astype("float32")
    value = query if causal else rng.normal(size=(batch, s, 12)).astype("float32")
    q_mask, v_mask = _padding(rng, batch, t), _padding(rng, batch, value.shape[1])
    layer = kt.MultiHeadAttention(num_heads=heads, d_model=d_model)
    result = layer(
        query,
        value,
        query_mask=q_mask,
        value_mask=v_mask,
        use_causal_mask=causal,
        return_attention_scores=return_scores,
    )
    mask = q_mask[:, :, None] & v_mask[:, None, :]
    if causal:
        mask = mask & np.tril(np.ones((t, value.shape[1]), bool))
    expected, expected_w = _np_mha(layer, query, value, mask)
    out = _np(result[0] if return_scores else result)
    np.testing.assert_allclose(out, expected, atol=3e-5, rtol=1e-5)
    if return_scores:
        assert result[1].shape == (batch, heads, t, value.shape[1])
        np.testing.assert_allclose(_np(result[1]), expected_w, atol=2e-6)


@pytest.mark.slow
def test_mha_matches_keras_multi_head_attention(rng):
    batch, t, s, d_model, heads = 2, 6, 7, 32, 4
    d_k = d_model // heads
    query = rng.normal(size=(batch, t, d_model)).astype("float32")
    value = rng.normal(size=(batch, s, d_model)).astype("float32")
    q_mask, v_mask = _padding(rng, batch, t), _padding(rng, batch, s)

    ours = kt.MultiHeadAttention(num_heads=heads, d_model=d_model)
    ours(query, value)
    reference = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=d_k)
    reference(query, value)
    for name in ("query", "key", "value"):
        dense = getattr(ours, f"{name}_dense")
        target = getattr(reference, f"_{name}_dense")
        target.kernel.assign(np.reshape(_np(dense.kernel), (d_model, heads, d_k)))
        target.bias.assign(np.reshape(_np(dense.bias), (heads, d_k)))
    reference._output_dense.kernel.assign(
        np.reshape(_np(ours.output_dense.kernel), (heads, d_k, d_model))
    )
    reference._output_dense.bias.assign(_np(ours.output_dense.bias))

    # Causal masks agree only for T_q == T_k: Keras aligns a causal mask to the
    # first key, ours to the last (the newest queries of a decoder cache).
    for causal, keep in ((False, s), (True, t)):
        value, v_mask = value[:, :keep], v_mask[:, :keep]
        kwargs = dict(
            query_mask=q_mask,
            value_mask=v_mask,
            use_causal_mask=causal,
            return_attention_scores=True,
        )
        out, scores = ours(query, value, **kwargs)
        ref_out, ref_scores = reference(query, value, **kwargs)
        assert tuple(scores.shape) == tuple(ref_scores.shape) == (batch, heads, t, keep)
        out_fused = ours(query, value, **{**kwargs, "return_attention_scores": False})
        # Padded queries see no key at all. Such rows are finite in both, but
        # Keras' masked softmax then attends to every key (the fill cancels
        # out), ours to the average of all keys: compare the real queries.
        real = q_mask
        assert np.isfinite(_np(out)).all() and np.isfinite(_np(out_fused)).all()
        np.testing.assert_allclose(_np(out)[real], _np(ref_out)[real], atol=3e-5)
        np.testing.assert_allclose(_np(out_fused)[real], _np(ref_out)[real], atol=3e-5)
        np.testing.assert_allclose(
            _np(scores).transpose(0, 2, 1, 3)[real],
            _np(ref_scores).transpose(0, 2, 1, 3)[real],
            atol=2e-6,
        )


@pytest.mark.slow
def test_mha_implicit_keras_masks_equal_explicit_masks(rng):
    vocab, d_model = 20, 16
    ids_q = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]], "int32")
    ids_v = np.array([[1, 2, 3, 4, 0, 0], [5, 6, 7, 8, 9, 2]], "int32")
    embed = keras.layers.Embedding(vocab, d_model, mask_zero=True)
    mha = kt.MultiHeadAttention(num_heads=4, d_model=d_model)

    in_q = keras.Input((None,), dtype="int32")
    in_v = keras.Input((None,), dtype="int32")
    implicit = keras.Model([in_q, in_v], mha(embed(in_q), embed(in_v)))
    got = _np(implicit([ids_q, ids_v]))

    explicit = mha(
        embed(ids_q),
        embed(ids_v),
        query_mask=ids_q != 0,
        value_mask=ids_v != 0,
    )
    np.testing.assert_allclose(got, _np(explicit), atol=1e-6)
    # Embeddings without a Keras mask attached: no mask reaches the layer.
    table = embed.embeddings
    unmasked = _np(mha(ops.take(table, ids_q, axis=0), ops.take(table, ids_v, axis=0)))
    # The masks matter: without them the padded keys change the result.
    assert not np.allclose(got[0, :3], unmasked[0, :3], atol=1e-4)


@pytest.mark.slow
def test_mha_output_keeps_the_query_mask():
    ids = np.array([[3, 4, 0]], "int32")
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    y = kt.MultiHeadAttention(num_heads=2, d_model=8)(x, x)
    # A layer downstream sees the mask: mean over real positions only.
    pooled = keras.layers.GlobalAveragePooling1D()(y)
    model = keras.Model(inputs, [y, pooled])
    seq, mean = model(ids)
    np.testing.assert_allclose(_np(mean)[0], _np(seq)[0, :2].mean(0), atol=1e-6)


def test_mha_key_differs_from_value(rng):
    query = rng.normal(size=(2, 3, 8)).astype("float32")
    key = rng.normal(size=(2, 4, 8)).astype("float32")
    value = rng.normal(size=(2, 4, 8)).astype("float32")
    layer = kt.MultiHeadAttention(num_heads=2, d_model=8)
    out = layer(query, value, key=key)
    assert out.shape == (2, 3, 8)
    swapped = layer(query, key, key=value)
    assert not np.allclose(_np(out), _np(swapped), atol=1e-4)


def test_mha_explicit_attention_mask(rng):
    x = rng.normal(size=(2, 4, 8)).astype("float32")
    mask = _random_mask(rng, (2, 4, 4))
    layer = kt.MultiHeadAttention(num_heads=2, d_model=8)
    out = layer(x, x, attention_mask=mask)
    expected, _ = _np_mha(layer, x, x, mask)
    np.testing.assert_allclose(_np(out), expected, atol=3e-5)


def test_mha_head_count_must_divide_d_model():
    with pytest.raises(ValueError, match=r"num_heads=7, d_model=512"):
        kt.MultiHeadAttention(num_heads=7, d_model=512)
    with pytest.raises(ValueError, match="num_heads"):
        kt.MultiHeadAttention(num_heads=0, d_model=512)


@pytest.mark.slow
def test_mha_layer_checks(rng, tmp_path):
    query = rng.normal(size=(2, 4, 8)).astype("float32")
    value = rng.normal(size=(2, 5, 8)).astype("float32")
    run_layer_test(
        kt.MultiHeadAttention,
        {"num_heads": 2, "d_model": 8, "dropout": 0.1},
        {"query": query, "value": value},
        expected_output_shape=(2, 4, 8),
        # Q, K, V and output projections, each a kernel and a bias.
        expected_num_trainable_weights=8,
        tmp_path=tmp_path,
    )


def test_symbolic_calls_return_attention_scores():
    query = keras.Input((4, 8), batch_size=2)
    value = keras.Input((5, 8), batch_size=2)
    out, scores = kt.MultiHeadAttention(num_heads=2, d_model=8)(
        query, value, return_attention_scores=True
    )
    assert tuple(out.shape) == (2, 4, 8)
    assert tuple(scores.shape) == (2, 2, 4, 5)
    v6 = keras.Input((5, 6), batch_size=2)
    out, weights = kt.ScaledDotProductAttention()(
        query, value, v6, return_attention_scores=True
    )
    assert tuple(out.shape) == (2, 4, 6)
    assert tuple(weights.shape) == (2, 4, 5)


# --------------------------------------------------------------------------
# MultiHeadAttention with a cache (incremental decoding, §3.2.3)
# --------------------------------------------------------------------------


def test_mha_cached_self_attention_equals_causal_attention(rng):
    """Fed one position at a time, with its keys and values written into the
    cache, each output equals the causal attention over the whole sequence
    at that position."""
    mha = kt.MultiHeadAttention(num_heads=2, d_model=8)
    x = rng.standard_normal((3, 5, 8)).astype("float32")
    full = _np(mha(x, x, use_causal_mask=True))
    zeros = ops.zeros((3, 2, 7, 4))  # (B, H, T_max, d_k): 7 positions, 5 used
    cache = (zeros, zeros)
    for t in range(5):
        out, cache = mha(
            x[:, t : t + 1],
            x[:, t : t + 1],
            use_causal_mask=True,
            cache=cache,
            cache_update_index=t,
        )
        np.testing.assert_allclose(_np(out)[:, 0], full[:, t], atol=1e-5)
    keys = _np(cache[0])
    expected = _np(mha.compute_key_value(x)[0])
    np.testing.assert_allclose(keys[:, :, :5], expected, atol=1e-6)
    assert np.all(keys[:, :, 5:] == 0)


def test_mha_cache_of_two_positions_at_once(rng):
    """Two queries written at index 2: each sees the cache up to itself."""
    mha = kt.MultiHeadAttention(num_heads=2, d_model=8)
    x = rng.standard_normal((2, 4, 8)).astype("float32")
    full = _np(mha(x, x, use_causal_mask=True))
    keys, values = mha.compute_key_value(x[:, :2])
    pad = ops.zeros((2, 2, 2, 4))
    cache = (ops.concatenate([keys, pad], 2), ops.concatenate([values, pad], 2))
    out, _ = mha(
        x[:, 2:], x[:, 2:], use_causal_mask=True, cache=cache, cache_update_index=2
    )
    np.testing.assert_allclose(_np(out), full[:, 2:], atol=1e-5)


def test_mha_cross_attention_cache_equals_the_keys_and_values(rng):
    mha = kt.MultiHeadAttention(num_heads=2, d_model=8)
    q = rng.standard_normal((2, 3, 8)).astype("float32")
    memory = rng.standard_normal((2, 6, 8)).astype("float32")
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    expected = _np(mha(q, memory, value_mask=mask))
    out, cache = mha(q, value_mask=mask, cache=mha.compute_key_value(memory))
    np.testing.assert_allclose(_np(out), expected, atol=1e-6)
    assert tuple(cache[0].shape) == (2, 2, 6, 4)
