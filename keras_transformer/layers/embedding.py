"""Token embedding shared by source, target and the pre-softmax projection (§3.4)."""

import math

import keras
from keras import ops

from keras_transformer._guards import checks as _checks
from keras_transformer.layers.masks import padding_mask


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(keras.layers.Layer):
    """Learned token embedding, scaled by √d_model, usable as the output projection.

    §3.4: "we share the same weight matrix between the two embedding layers and
    the pre-softmax linear transformation ... In the embedding layers, we
    multiply those weights by √d_model." Called on ids it embeds; called with
    ``reverse=True`` on ``(B, T, d_model)`` it returns logits ``x Eᵀ`` (no
    scaling) in float32, plus a learned bias with ``logits_bias=True``.

    The default initializer is ``N(0, d_model^-1/2)``, so that the scaled
    embeddings have unit variance, the same scale as the positional encoding.

    ``PAD_ID`` (0) is padding: the layer emits a Keras mask ``ids != PAD_ID``. Ids
    outside ``[0, vocab_size)`` and non-integer ids raise errors (the JAX
    backend would otherwise return NaN for them).

    Args:
        vocab_size: int, number of token ids.
        d_model: int, embedding width.
        scale: bool, multiply by √d_model (default True, as in the paper).
        logits_bias: bool, add a learned ``(vocab_size,)`` bias to the logits
            of ``reverse`` (default False, as in the paper; Marian's models
            have one).
        embeddings_initializer: initializer for the ``(vocab_size, d_model)``
            matrix.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: integer ids ``(B, T)``, or ``(B, T, d_model)`` with ``reverse``.
        reverse: bool, project to vocabulary logits instead of embedding.
    """

    def __init__(
        self,
        vocab_size,
        d_model,
        scale=True,
        embeddings_initializer=None,
        logits_bias=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{name} must be a positive integer. Received: {name}={value}"
                )
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.scale = bool(scale)
        self.logits_bias = bool(logits_bias)
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(
                stddev=d_model**-0.5
            )
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.supports_masking = True

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            shape=(self.vocab_size, self.d_model),
            initializer=self.embeddings_initializer,
            name="embeddings",
        )
        self.bias = None
        if self.logits_bias:
            self.bias = self.add_weight(
                shape=(self.vocab_size,), initializer="zeros", name="logits_bias"
            )
        self.built = True

    def call(self, inputs, reverse=False):
        if reverse:
            # Pre-softmax linear transformation with the shared matrix (§3.4).
            kernel = ops.cast(self.embeddings, self.compute_dtype)
            logits = ops.cast(ops.matmul(inputs, ops.transpose(kernel)), "float32")
            if self.bias is not None:
                # Added in float32 under mixed precision, as the logits are.
                logits = logits + ops.cast(self.bias, "float32")
            return logits
        _checks.check_integer(inputs, f"Inputs to {self.name!r}")
        inputs = _checks.check_not_empty(inputs, f"Inputs to {self.name!r}")
        inputs = _checks.check_range(
            inputs,
            0,
            self.vocab_size,
            f"Token ids must be in [0, {self.vocab_size}) for {self.name!r} "
            f"(vocab_size={self.vocab_size}). Received ids from {{lo}} to {{hi}}.",
        )
        x = self.lookup(inputs)
        return _checks.nan_unless_in_range(x, inputs, 0, self.vocab_size)

    def lookup(self, ids):
        """The scaled embeddings of ``ids``, without the range checks of
        ``call``: for ids known to be in range, such as a decoder's own
        argmax inside a compiled decoding loop, where a check per step costs
        a host round trip."""
        x = ops.cast(ops.take(self.embeddings, ids, axis=0), self.compute_dtype)
        if self.scale:
            # §3.4: "we multiply those weights by sqrt(d_model)".
            x = x * ops.cast(math.sqrt(self.d_model), self.compute_dtype)
        return x

    def compute_mask(self, inputs, previous_mask=None):
        if "int" in keras.backend.standardize_dtype(inputs.dtype):
            return padding_mask(inputs)
        return previous_mask  # reverse mode: keep the decoder's mask

    def compute_output_shape(self, input_shape, reverse=False):
        if reverse:
            return tuple(input_shape[:-1]) + (self.vocab_size,)
        return tuple(input_shape) + (self.d_model,)

    def compute_output_spec(self, inputs, reverse=False):
        shape = self.compute_output_shape(inputs.shape, reverse=reverse)
        dtype = "float32" if reverse else self.compute_dtype
        return keras.KerasTensor(shape, dtype=dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "d_model": self.d_model,
                "scale": self.scale,
                "logits_bias": self.logits_bias,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
