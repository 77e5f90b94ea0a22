"""Encoder and decoder layers (paper §3.1, Figure 1)."""

import inspect

import keras
from keras import ops

from keras_transformer._guards import checks as _checks
from keras_transformer.layers.attention import (
    MultiHeadAttention,
    _fresh_initializer,
    _validate_rate,
    call_sublayer,
)
from keras_transformer.layers.dropout import Dropout


class _Block(keras.layers.Layer):
    """Shared arguments, sub-layer factories and config of the two blocks."""

    def __init__(
        self,
        d_model,
        num_heads,
        d_ff,
        dropout=0.1,
        attention_dropout=0.0,
        norm_first=False,
        activation="relu",
        layer_norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (
            ("d_model", d_model),
            ("num_heads", num_heads),
            ("d_ff", d_ff),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{name} must be a positive integer. Received: {name}={value}"
                )
        if d_model % num_heads:
            raise ValueError(
                "d_model must be divisible by num_heads. "
                f"Received: num_heads={num_heads}, d_model={d_model}"
            )
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = _validate_rate("dropout", dropout)
        self.attention_dropout = _validate_rate("attention_dropout", attention_dropout)
        self.norm_first = bool(norm_first)
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _initializers(self):
        return {
            "kernel_initializer": _fresh_initializer(self.kernel_initializer),
            "bias_initializer": _fresh_initializer(self.bias_initializer),
        }

    def _check_width(self, shape, name):
        if shape[-1] != self.d_model:
            raise ValueError(
                f"The last axis of {name} must equal d_model={self.d_model} "
                f"(the residual connections add it to the sub-layer outputs). "
                f"Received: {name} shape={tuple(shape)}"
            )

    def _attention(self, name, shape, value_shape):
        layer = MultiHeadAttention(
            self.num_heads,
            self.d_model,
            dropout=self.attention_dropout,
            dtype=self.dtype_policy,
            name=name,
            **self._initializers(),
        )
        layer.build(shape, value_shape)
        return layer

    def _self_attend(self, x, mask, **kwargs):
        """``self.self_attention`` of ``x`` to itself under padding ``mask``,
        through ``call`` rather than ``Layer.__call__``.

        Through ``__call__`` one tensor would arrive twice among Keras'
        ``*args, **kwargs`` (queries and values, query and value masks).
        ``jit_compile=True`` on the PyTorch backend (``torch.compile``) then
        crashes in torch 2.13 (pytorch/pytorch#176211): when dynamo recompiles
        Keras' ``__call__`` code, shared by all layers, for such a call, its
        report of the failed tensor-aliasing guard looks up the keyword
        arguments of an earlier layer's call and raises ``KeyError``.
        ``__call__`` would add nothing here: the block's own ``__call__`` has
        resolved ``training`` and the masks, the input is in the compute
        dtype, the sub-layer was built with the block, and its ``Dense``
        layers cast their own variables. (The model's compiled steps run the
        forward pass as one graph, so Dynamo does not recompile ``__call__``
        there; compiled code that breaks its graph inside a layer would.)
        """
        return self.self_attention.call(
            x, x, query_mask=mask, value_mask=mask, **kwargs
        )

    def _norm(self, name, shape):
        layer = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )
        layer.build(shape)
        return layer

    def _dropout(self, name):
        return Dropout(self.dropout, dtype=self.dtype_policy, name=name)

    def _build_feed_forward(self, shape):
        # §3.3: FFN(x) = max(0, x W1 + b1) W2 + b2, inner width d_ff.
        self.ffn_inner = keras.layers.Dense(
            self.d_ff,
            activation=self.activation,
            dtype=self.dtype_policy,
            name="ffn_inner",
            **self._initializers(),
        )
        self.ffn_inner.build(shape)
        self.ffn_outer = keras.layers.Dense(
            self.d_model,
            dtype=self.dtype_policy,
            name="ffn_outer",
            **self._initializers(),
        )
        self.ffn_outer.build(tuple(shape[:-1]) + (self.d_ff,))
        self.ffn_dropout = self._dropout("ffn_dropout")
        self.ffn_norm = self._norm("ffn_norm", shape)

    def _sublayer(self, x, norm, dropout, fn, training):
        """§3.1 and §5.4: LayerNorm(x + Dropout(Sublayer(x))), or pre-LN."""
        residual = x
        if self.norm_first:
            x = call_sublayer(norm, x)
        x = fn(x)
        if training:
            x = dropout(x, training=training)
        x = ops.add(residual, x)
        if not self.norm_first:
            x = call_sublayer(norm, x)
        return x

    def _feed_forward(self, x, training):
        return self._sublayer(
            x,
            self.ffn_norm,
            self.ffn_dropout,
            lambda y: call_sublayer(self.ffn_outer, call_sublayer(self.ffn_inner, y)),
            training,
        )

    def compute_output_spec(self, *args, **kwargs):
        """The output of a symbolic call (a functional graph's): a tensor
        shaped like the first input, in the compute dtype.

        Keras' default traces ``call`` on placeholders: most of the time
        ``build_model`` takes, and the model is built again by ``load_model``
        and by every copy. Calls that also return attention weights or a
        cache are traced as Keras does.
        """
        signature = inspect.signature(self.call)
        given = signature.bind(*args, **kwargs).arguments
        if given.get("return_attention_scores") or any(
            given.get(name) is not None
            for name in ("self_attention_cache", "cross_attention_cache")
        ):
            return super().compute_output_spec(*args, **kwargs)
        self._check_call(given)
        sequence = given[next(iter(signature.parameters))]
        return keras.KerasTensor(sequence.shape, dtype=self.compute_dtype)

    def _check_call(self, given):
        """The checks of ``call`` that shapes decide, on its bound arguments."""

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_model": self.d_model,
                "num_heads": self.num_heads,
                "d_ff": self.d_ff,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "norm_first": self.norm_first,
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderBlock(_Block):
    """One encoder layer: self-attention, then a feed-forward network (§3.1).

    Each sub-layer is wrapped as ``LayerNorm(x + Dropout(Sublayer(x)))``
    (post-LN, the paper's form); with ``norm_first=True`` it is
    ``x + Dropout(Sublayer(LayerNorm(x)))`` (pre-LN; a stack of pre-LN blocks
    needs a final LayerNorm, which ``build_model`` adds).

    Args:
        d_model: int, width of the residual stream.
        num_heads: int, attention heads; must divide ``d_model``.
        d_ff: int, inner width of the feed-forward network.
        dropout: float, residual dropout on each sub-layer output (§5.4).
        attention_dropout: float, dropout on attention weights (default 0).
        norm_first: bool, pre-LN instead of the paper's post-LN.
        activation: feed-forward activation, ``"relu"`` in the paper.
        layer_norm_epsilon: float.
        kernel_initializer, bias_initializer: for all dense sub-layers.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: ``(B, T, d_model)``.
        mask: optional ``(B, T)`` padding mask, True for real tokens; taken
            from the input's Keras mask when not given, and passed on.
        attention_mask: optional extra mask broadcastable to ``(B, T, T)``.
        return_attention_scores: bool, also return the self-attention weights
            ``(B, num_heads, T, T)``.
        training: Python bool.

    Example:

    >>> block = EncoderBlock(d_model=64, num_heads=4, d_ff=256)
    >>> block(keras.random.normal((2, 7, 64))).shape
    (2, 7, 64)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, §3.1, §3.3, §5.4.
    """

    def build(self, input_shape):
        self._check_width(input_shape, "inputs")
        self.self_attention = self._attention(
            "self_attention", input_shape, input_shape
        )
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.self_attention_norm = self._norm("self_attention_norm", input_shape)
        self._build_feed_forward(input_shape)
        self.built = True

    def call(
        self,
        inputs,
        mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        scores = []

        # Sub-layer 1: multi-head self-attention over the source (§3.2.3).
        def attend(x):
            out = self._self_attend(
                x,
                mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if return_attention_scores:
                out, weights = out
                scores.append(weights)
            return out

        x = self._sublayer(
            inputs,
            self.self_attention_norm,
            self.self_attention_dropout,
            attend,
            training,
        )

        # Sub-layer 2: position-wise feed-forward network (§3.3).
        x = self._feed_forward(x, training)
        return (x, scores[0]) if return_attention_scores else x


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderBlock(_Block):
    """One decoder layer: masked self-attention, cross-attention, feed-forward (§3.1).

    The cross-attention takes its queries from the decoder and its keys and
    values from the encoder output, masked with the *encoder's* padding mask
    (§3.2.3).

    Args: as for ``EncoderBlock``.

    Call arguments:
        decoder_sequence: ``(B, T, d_model)``.
        encoder_sequence: ``(B, S, d_model)``, the encoder output.
        decoder_sequence_mask: optional ``(B, T)`` padding mask of the
            decoder input; from its Keras mask when not given; passed on.
        encoder_sequence_mask: optional ``(B, S)`` padding mask of the
            source; from the encoder output's Keras mask when not given.
        use_causal_mask: bool, default True: position ``i`` attends only to
            positions ``<= i`` in the self-attention (§3.2.3).
        self_attention_mask: optional extra mask for the self-attention,
            broadcastable to ``(B, T, T)``.
        cross_attention_mask: optional extra mask for the cross-attention,
            broadcastable to ``(B, T, S)``.
        self_attention_cache: optional ``(keys, values)``, each
            ``(B, num_heads, T_max, d_k)``: the self-attention keys and values
            of the positions decoded so far. The keys and values of
            ``decoder_sequence`` are written into it at
            ``self_attention_cache_update_index``, and the updated cache is
            returned as the last output.
        self_attention_cache_update_index: scalar int, the position of the
            first row of ``decoder_sequence``.
        cross_attention_cache: optional ``(keys, values)`` of the encoder
            output, from ``compute_cross_attention_cache``; then
            ``encoder_sequence`` is not needed.
        return_attention_scores: bool, also return a tuple
            ``(self_attention_weights, cross_attention_weights)``.
        training: Python bool.

    Returns:
        ``(B, T, d_model)``; then the attention weights if asked for; then
        the updated self-attention cache if one was given.

    Example:

    >>> block = DecoderBlock(d_model=64, num_heads=4, d_ff=256)
    >>> x, memory = keras.random.normal((2, 5, 64)), keras.random.normal((2, 7, 64))
    >>> block(x, memory).shape
    (2, 5, 64)

    References:
        Vaswani et al., "Attention Is All You Need", 2017, §3.1, §3.2.3.
    """

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        if encoder_sequence_shape is None:
            raise ValueError("DecoderBlock needs encoder_sequence_shape to build.")
        self._check_width(decoder_sequence_shape, "decoder_sequence")
        self._check_width(encoder_sequence_shape, "encoder_sequence")
        shape = decoder_sequence_shape
        self.self_attention = self._attention("self_attention", shape, shape)
        self.self_attention_dropout = self._dropout("self_attention_dropout")
        self.self_attention_norm = self._norm("self_attention_norm", shape)
        self.cross_attention = self._attention(
            "cross_attention", shape, encoder_sequence_shape
        )
        self.cross_attention_dropout = self._dropout("cross_attention_dropout")
        self.cross_attention_norm = self._norm("cross_attention_norm", shape)
        self._build_feed_forward(shape)
        self.built = True

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_sequence_mask=None,
        encoder_sequence_mask=None,
        use_causal_mask=True,
        self_attention_mask=None,
        cross_attention_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
    ):
        self._check_encoder_sequence(
            decoder_sequence, encoder_sequence, cross_attention_cache
        )
        scores, caches = [], []

        def keep(out, cache_given):
            """The attention output; weights and cache put aside."""
            if not (return_attention_scores or cache_given):
                return out
            out, *rest = out
            if return_attention_scores:
                scores.append(rest.pop(0))
            if cache_given:
                caches.append(rest.pop(0))
            return out

        # Sub-layer 1: masked multi-head self-attention over the target (§3.2.3).
        own = dict(
            attention_mask=self_attention_mask,
            use_causal_mask=use_causal_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            cache=self_attention_cache,
            cache_update_index=self_attention_cache_update_index,
        )
        x = self._sublayer(
            decoder_sequence,
            self.self_attention_norm,
            self.self_attention_dropout,
            lambda y: keep(
                self._self_attend(y, decoder_sequence_mask, **own),
                self_attention_cache is not None,
            ),
            training,
        )

        # Sub-layer 2: cross-attention, queries from the decoder, keys and
        # values from the encoder, masked by the encoder's padding (§3.2.3).
        cross = dict(
            query_mask=decoder_sequence_mask,
            value_mask=encoder_sequence_mask,
            attention_mask=cross_attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            cache=cross_attention_cache,
        )
        x = self._sublayer(
            x,
            self.cross_attention_norm,
            self.cross_attention_dropout,
            lambda y: keep(
                call_sublayer(self.cross_attention, y, encoder_sequence, **cross),
                cross_attention_cache is not None,
            ),
            training,
        )

        # Sub-layer 3: position-wise feed-forward network (§3.3).
        x = self._feed_forward(x, training)
        outputs = (x,)
        if return_attention_scores:
            outputs += (tuple(scores),)
        if self_attention_cache is not None:
            outputs += (caches[0],)
        return outputs[0] if len(outputs) == 1 else outputs

    def _check_call(self, given):
        self._check_encoder_sequence(
            given["decoder_sequence"],
            given.get("encoder_sequence"),
            given.get("cross_attention_cache"),
        )

    @staticmethod
    def _check_encoder_sequence(decoder_sequence, encoder_sequence, cache):
        if encoder_sequence is None and cache is None:
            raise ValueError(
                "DecoderBlock needs encoder_sequence (or cross_attention_cache)."
            )
        if encoder_sequence is not None:
            _checks.check_same_batch(
                decoder_sequence,
                encoder_sequence,
                "decoder_sequence",
                "encoder_sequence",
            )

    def compute_cross_attention_cache(self, encoder_sequence):
        """The cross-attention keys and values of an encoder output.

        They depend only on the source: a decoder computes them once per input
        and passes them as ``cross_attention_cache`` at every step.

        Returns:
            ``(keys, values)``, each ``(B, num_heads, S, d_k)``.
        """
        return self.cross_attention.compute_key_value(encoder_sequence)
