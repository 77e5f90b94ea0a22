"""Scaled dot-product attention and multi-head attention (paper §3.2)."""

import math

import keras
from keras import ops

from keras_transformer import backend
from keras_transformer._guards import checks as _checks
from keras_transformer.layers import masks as masks_lib
from keras_transformer.layers.dropout import Dropout

# Masked logits get this fill before the explicit path's float32 softmax (it
# would overflow float16). Being finite, it makes a fully masked row a uniform
# average, as every Keras backend's fused kernel does.
_FLOAT32_MASK_FILL = -0.7 * 3.4028235e38


def _fresh_initializer(initializer):
    """A new initializer with the same config, so each sub-layer draws its own
    values (a shared initializer object would repeat them). Not through
    ``keras.initializers.serialize``, which imports TensorFlow to ask whether
    it is installed: a model on JAX or PyTorch should not load it."""
    initializer = keras.initializers.get(initializer)
    return type(initializer).from_config(initializer.get_config())


def call_sublayer(layer, *args, **kwargs):
    """``layer(*args, **kwargs)`` for a built sub-layer, without ``Layer.__call__``
    where it adds nothing.

    ``Layer.__call__`` does bookkeeping around ``call`` (argument binding,
    masks, name scopes, autocasting) that costs more than the arithmetic of a
    one-token decoding step when PyTorch runs it eagerly: about 25 sub-layer
    calls per decoder layer and step. A sub-layer built by its parent, whose
    policy computes in its variables' dtype, has nothing for ``__call__`` to
    do; under a mixed-precision policy ``__call__`` is used, which casts the
    variables and inputs.
    """
    policy = layer.dtype_policy
    if policy.compute_dtype == policy.variable_dtype:
        return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)


def _heads_first(x):
    # (B, T, H, d) -> (B, H, T, d)
    return ops.transpose(x, (0, 2, 1, 3))


def _validate_rate(name, value):
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1). Received: {name}={value}")
    return float(value)


@keras.saving.register_keras_serializable(package="keras_transformer")
class ScaledDotProductAttention(keras.layers.Layer):
    """Scaled dot-product attention, ``softmax(Q Kᵀ / √d_k) V`` (§3.2.1).

    Without attention dropout and without weights to return, the call goes
    through ``keras.ops.dot_product_attention`` and the backend's fused
    (flash) kernel where one fits, except PyTorch's slower CPU kernel in
    bfloat16; otherwise the weights are computed, with the softmax in float32.

    Args:
        dropout: float in [0, 1). Dropout on the attention weights. The paper
            has none (§5.4 drops sub-layer outputs); it is 0 by default because
            it rules out the fused kernels.
        **kwargs: base layer arguments (``name``, ``dtype``, ...).

    Call arguments:
        query: ``(..., T_q, d_k)``.
        key: ``(..., T_k, d_k)``.
        value: ``(..., T_k, d_v)``.
        mask: optional boolean tensor broadcastable to ``(..., T_q, T_k)``;
            True means "may attend".
        is_causal: if True, query ``i`` may only attend keys ``j <= i``
            (aligned to the last key when ``T_q < T_k``).
        return_attention_scores: if True, also return the weights
            ``(..., T_q, T_k)``.
        training: Python bool; enables attention dropout.

    Example:

    >>> q = k = v = keras.random.normal((2, 5, 16))
    >>> ScaledDotProductAttention()(q, k, v, is_causal=True).shape
    (2, 5, 16)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, §3.2.1.
    """

    def __init__(self, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.dropout = _validate_rate("dropout", dropout)
        self.dropout_layer = Dropout(
            self.dropout, dtype=self.dtype_policy, name="attention_dropout"
        )

    def build(self, *input_shapes):
        self.dropout_layer.build(None)
        self.built = True

    def compute_mask(self, inputs, previous_mask=None):
        # The output is a new sequence aligned with the queries; the `mask`
        # argument is an attention mask, not a padding mask to pass on.
        return None

    def call(
        self,
        query,
        key,
        value,
        mask=None,
        is_causal=False,
        return_attention_scores=False,
        training=None,
    ):
        rank = len(query.shape)
        if not 2 <= rank <= 4 or len(key.shape) != rank or len(value.shape) != rank:
            raise ValueError(
                "query, key and value must have the same rank, 2 to 4: "
                "(T, d), (B, T, d) or (B, H, T, d). "
                f"Received: query.shape={query.shape}, key.shape={key.shape}, "
                f"value.shape={value.shape}"
            )
        # Bring everything to (B, T, H, d), the layout of
        # keras.ops.dot_product_attention, and the mask to rank 4.
        if rank == 4:  # (B, H, T, d)
            query, key, value = (
                ops.transpose(t, (0, 2, 1, 3)) for t in (query, key, value)
            )
        elif rank == 3:  # (B, T, d) -> (B, T, 1, d)
            query, key, value = (ops.expand_dims(t, 2) for t in (query, key, value))
        else:  # (T, d) -> (1, T, 1, d)
            query, key, value = (t[None, :, None, :] for t in (query, key, value))
        if mask is not None:
            mask = ops.cast(mask, "bool")
            while len(mask.shape) < 4:
                # (T_q, T_k) -> (1, T_q, T_k); (B, T_q, T_k) -> (B, 1, T_q, T_k)
                mask = ops.expand_dims(mask, 0 if len(mask.shape) < 3 else 1)
        outputs = self.attend(
            query,
            key,
            value,
            mask=mask,
            is_causal=is_causal,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        output, weights = outputs if return_attention_scores else (outputs, None)
        # (B, T_q, H, d_v) -> the input layout; weights (B, H, T_q, T_k) likewise.
        if rank == 4:
            output = ops.transpose(output, (0, 2, 1, 3))
        elif rank == 3:
            output = ops.squeeze(output, 2)
            weights = None if weights is None else ops.squeeze(weights, 1)
        else:
            output = output[0, :, 0, :]
            weights = None if weights is None else weights[0, 0]
        return (output, weights) if return_attention_scores else output

    def attend(
        self,
        query,
        key,
        value,
        mask=None,
        is_causal=False,
        return_attention_scores=False,
        training=None,
        heads_first_key_value=False,
    ):
        """Attention on heads-last tensors: ``(B, T, H, d)`` -> ``(B, T_q, H, d_v)``.

        ``mask`` is broadcastable to ``(B, H, T_q, T_k)``. Weights, if asked
        for, are ``(B, H, T_q, T_k)``. This is the layout ``MultiHeadAttention``
        produces without a transpose, so it calls this method directly.

        ``heads_first_key_value=True``: ``key`` and ``value`` are
        ``(B, H, T_k, d)``, the layout of a decoding cache, which a step then
        reads without a transpose; the products take that layout directly
        (the explicit path: the fused kernel wants heads last).
        """
        d_k = query.shape[-1]
        scale = 1.0 / math.sqrt(d_k)
        time_axis = 2 if heads_first_key_value else 1
        q_len = _checks.static_dim(query, 1)
        k_len = _checks.static_dim(key, time_axis)
        dropout_active = self.dropout > 0 and bool(training)

        # A bare is_causal keeps the fused kernels' own causal path; it means
        # top-left alignment there, which equals ours only when T_q == T_k.
        fused_causal = (
            is_causal and mask is None and q_len is not None and q_len == k_len
        )
        if is_causal and not fused_causal:
            q_len_t, k_len_t = ops.shape(query)[1], ops.shape(key)[time_axis]
            mask = masks_lib.merge_masks(mask, masks_lib.causal_mask(q_len_t, k_len_t))

        if not (
            return_attention_scores
            or dropout_active
            or heads_first_key_value
            or backend.fused_attention_fails(
                query.dtype, query.shape[-1], value.shape[-1]
            )
            or backend.fused_attention_is_slower(query)
        ):
            return ops.dot_product_attention(
                query,
                key,
                value,
                mask=mask,
                scale=scale,
                is_causal=fused_causal,
                flash_attention=backend.flash_attention_flag(),
            )

        if fused_causal:
            mask = masks_lib.causal_mask(ops.shape(query)[1], ops.shape(key)[1])
        kv = "bhkd" if heads_first_key_value else "bkhd"
        # Scale the queries before the product so that float16 logits stay small.
        logits = ops.einsum(
            f"bqhd,{kv}->bhqk", query * ops.cast(scale, query.dtype), key
        )
        logits = ops.cast(logits, "float32")
        if mask is not None:
            logits = ops.where(mask, logits, _FLOAT32_MASK_FILL)
        weights = ops.softmax(logits, axis=-1)  # (B, H, T_q, T_k), float32
        weights = ops.cast(weights, self.compute_dtype)
        dropped = (
            self.dropout_layer(weights, training=training)
            if dropout_active
            else weights
        )
        output = ops.einsum(f"bhqk,{kv}->bqhd", dropped, value)  # (B, T_q, H, d_v)
        if return_attention_scores:
            return output, weights
        return output

    def get_config(self):
        config = super().get_config()
        config.update({"dropout": self.dropout})
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention (§3.2.2).

    ``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`` with
    ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)`` and
    ``d_k = d_v = d_model / num_heads``. The per-head projections are stored as
    one ``d_model x d_model`` matrix each, split into heads by a reshape.

    Args:
        num_heads: int, number of heads ``h``.
        d_model: int, model width; must be divisible by ``num_heads``.
        dropout: float in [0, 1), dropout on the attention weights (default 0).
        use_bias: bool, whether the four projections have biases.
        kernel_initializer: initializer for the projection kernels.
        bias_initializer: initializer for the projection biases.
        **kwargs: base layer arguments.

    Call arguments:
        query: ``(B, T_q, dim_q)``.
        value: ``(B, T_k, dim_v)``.
        key: optional ``(B, T_k, dim_k)``; defaults to ``value``.
        query_mask, value_mask, key_mask: optional ``(B, T)`` padding masks.
            Filled in from the inputs' Keras masks when not given.
        attention_mask: optional boolean mask broadcastable to
            ``(B, T_q, T_k)`` (or ``(B, num_heads, T_q, T_k)``).
        use_causal_mask: bool, forbid attention to later positions (§3.2.3).
        return_attention_scores: bool, also return ``(B, num_heads, T_q, T_k)``.
        training: Python bool.
        cache: optional ``(keys, values)``, each ``(B, num_heads, T_k, d_k)``.
            With ``cache_update_index`` (decoding self-attention), the keys
            and values of this call are written into it at that position and
            the queries attend to all of it; ``use_causal_mask`` then hides
            the positions after each query's own. Without it (decoding
            cross-attention), they are the keys and values themselves, from
            ``compute_key_value``, and ``value``/``key`` are not needed.
        cache_update_index: scalar int, the position of the first query.

    Returns:
        ``(B, T_q, d_model)``; with ``return_attention_scores`` also the
        weights; with a ``cache``, also the cache (updated or as given), last.

    Example:

    >>> mha = MultiHeadAttention(num_heads=8, d_model=512)
    >>> x = keras.random.normal((2, 10, 512))
    >>> mha(x, x).shape
    (2, 10, 512)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, §3.2.2.
    """

    def __init__(
        self,
        num_heads,
        d_model,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_heads, int) or num_heads <= 0:
            raise ValueError(
                f"num_heads must be a positive integer. Received: num_heads={num_heads}"
            )
        if not isinstance(d_model, int) or d_model <= 0:
            raise ValueError(
                f"d_model must be a positive integer. Received: d_model={d_model}"
            )
        if d_model % num_heads:
            raise ValueError(
                "d_model must be divisible by num_heads (§3.2.2: "
                "d_k = d_model / h). "
                f"Received: num_heads={num_heads}, d_model={d_model}"
            )
        self.num_heads = num_heads
        self.d_model = d_model
        self.d_k = d_model // num_heads
        self.dropout = _validate_rate("dropout", dropout)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _dense(self, name):
        return keras.layers.Dense(
            self.d_model,
            use_bias=self.use_bias,
            kernel_initializer=_fresh_initializer(self.kernel_initializer),
            bias_initializer=_fresh_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self.query_dense = self._dense("query")
        self.query_dense.build(query_shape)
        self.key_dense = self._dense("key")
        self.key_dense.build(key_shape)
        self.value_dense = self._dense("value")
        self.value_dense.build(value_shape)
        self.output_dense = self._dense("attention_output")
        self.output_dense.build(tuple(query_shape[:-1]) + (self.d_model,))
        self.attention = ScaledDotProductAttention(
            self.dropout, dtype=self.dtype_policy, name="attention"
        )
        # Called through `attend`, never `__call__`: build it here, or Keras'
        # trainers see an unbuilt layer and rerun an eager pass every predict.
        self.attention.build()
        self.built = True

    def _split_heads(self, x):
        # (B, T, d_model) -> (B, T, H, d_k)
        return ops.reshape(x, tuple(ops.shape(x)[:2]) + (self.num_heads, self.d_k))

    def _project_key_value(self, value, key):
        """``(keys, values)``, each ``(B, T, H, d_k)``."""
        keys = self._split_heads(call_sublayer(self.key_dense, key))
        values = self._split_heads(call_sublayer(self.value_dense, value))
        return keys, values

    def compute_key_value(self, value, key=None):
        """The projected keys and values of a sequence, as a cache holds them.

        A decoder computes its cross-attention keys and values this way once
        per source, and passes them back as ``cache`` at every step. Heads
        come before positions: a decoding step then reads the cache without
        a transpose.

        Args:
            value: ``(B, T, dim_v)``.
            key: optional ``(B, T, dim_k)``; defaults to ``value``.

        Returns:
            ``(keys, values)``, each ``(B, num_heads, T, d_k)``.
        """
        keys, values = self._project_key_value(value, value if key is None else key)
        return _heads_first(keys), _heads_first(values)

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_update_index=None,
    ):
        if cache is not None and cache_update_index is None:
            # Keys and values given, already projected (cross-attention).
            k, v = cache
        else:
            if value is None:
                raise ValueError("MultiHeadAttention needs `value` (or a `cache`).")
            if key is None:
                key = value
                key_mask = value_mask if key_mask is None else key_mask
            k, v = self._project_key_value(value, key)  # (B, T_k, H, d_k)
        # Padding masks -> (B, T_q, T_k); then a heads axis -> (B, 1, T_q, T_k).
        mask = masks_lib.merge_masks(
            masks_lib.attention_mask_from_padding(query_mask, value_mask),
            masks_lib.attention_mask_from_padding(None, key_mask),
        )
        if cache is not None and cache_update_index is not None:
            k, v, visible = self._write_cache(
                cache, k, v, cache_update_index, ops.shape(query)[1], use_causal_mask
            )
            cache = (k, v)
            mask = masks_lib.merge_masks(mask, visible[None])  # (B, T_q, T_max)
            use_causal_mask = False
        if attention_mask is not None:
            attention_mask = ops.cast(attention_mask, "bool")
            if len(attention_mask.shape) == 4:
                mask = ops.expand_dims(mask, 1) if mask is not None else None
            mask = masks_lib.merge_masks(mask, attention_mask)
        if mask is not None and len(mask.shape) == 3:
            mask = ops.expand_dims(mask, 1)

        # (B, T_q, H, d_k), the layout of keras.ops.dot_product_attention.
        q = self._split_heads(call_sublayer(self.query_dense, query))
        outputs = self.attention.attend(
            q,
            k,
            v,
            mask=mask,
            is_causal=use_causal_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            heads_first_key_value=cache is not None,
        )
        output, weights = outputs if return_attention_scores else (outputs, None)
        # Concat(head_1, ..., head_h): (B, T_q, H, d_k) -> (B, T_q, d_model)
        output = ops.reshape(output, tuple(ops.shape(output)[:2]) + (self.d_model,))
        output = call_sublayer(self.output_dense, output)
        results = (output,)
        if return_attention_scores:
            results += (weights,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    @staticmethod
    def _write_cache(cache, k, v, index, query_length, causal):
        """Self-attention while decoding (§3.2.3): this call's keys and values
        (heads last) go into the cache (heads first) at ``index``; the queries
        see the cache up to their own position (``causal``) or up to the last
        position written: the later entries hold nothing yet.

        Returns the new keys, values and the ``(T_q, T_max)`` visibility mask.
        """
        start = (0, 0, index, 0)
        k, v = (
            ops.slice_update(old, start, ops.cast(_heads_first(new), old.dtype))
            for old, new in zip(cache, (k, v), strict=True)
        )
        last = index + (
            ops.arange(query_length, dtype="int32")
            if causal
            else ops.full((query_length,), query_length - 1, "int32")
        )
        key_positions = ops.arange(ops.shape(k)[2], dtype="int32")
        return k, v, ops.less_equal(key_positions[None, :], last[:, None])

    def compute_mask(self, query, previous_mask=None):
        # The output is aligned with the queries: it keeps the query mask.
        return previous_mask

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "d_model": self.d_model,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
