"""Sinusoidal positional encoding (paper §3.5)."""

import keras
from keras import ops

from keras_transformer._guards import checks as _checks


def sinusoidal_table(positions, d_model, base=10000.0):
    """PE for a 1-D tensor of positions: ``(T,)`` -> ``(T, d_model)``, float32.

    §3.5: ``PE(pos, 2i) = sin(pos / base^(2i/d_model))`` and
    ``PE(pos, 2i+1) = cos(pos / base^(2i/d_model))``: sine and cosine of the
    same frequency sit side by side (interleaved, not concatenated).
    """
    positions = ops.cast(positions, "float32")
    two_i = ops.arange(0, d_model, 2, dtype="float32")  # 2i = 0, 2, 4, ...
    inv_freq = ops.power(float(base), -two_i / float(d_model))  # base^(-2i/d)
    angles = ops.expand_dims(positions, 1) * ops.expand_dims(inv_freq, 0)  # (T, ⌈d/2⌉)
    pe = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # (T, ⌈d/2⌉, 2)
    pe = ops.reshape(pe, (-1, 2 * int(inv_freq.shape[0])))  # sin, cos, sin, ...
    return pe[:, :d_model]


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalEncoding(keras.layers.Layer):
    """Adds the fixed sinusoidal positional encoding of §3.5 to its input.

    The table is computed, not stored: the layer has no weights, and a model
    that uses it saves nothing for it.

    Args:
        max_length: int or None. The longest sequence accepted; longer input
            raises ``ValueError``. ``None`` accepts any length (the sinusoids
            are defined everywhere; the paper hoped they would extrapolate).
        base: float, the wavelength base, 10000 in the paper.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: ``(B, T, d_model)`` float tensor (e.g. scaled embeddings).
        start_index: int or scalar int tensor, the position of the first
            element of ``inputs``. Used when decoding one step at a time.
        check_length: bool (default True); False skips the run-time check
            of a tensor ``start_index`` against ``max_length``, for callers
            that bounded the positions before (a compiled decoding loop, where
            the check would cost a host round trip per step).

    Returns:
        ``inputs + PE[start_index : start_index + T]`` in the input's dtype. A
        Keras mask on the input is passed through.

    Example:

    >>> x = keras.ops.zeros((1, 3, 4))
    >>> SinusoidalEncoding()(x)[0, 1]  # sin(1), cos(1), sin(0.01), cos(0.01)
    """

    def __init__(self, max_length=None, base=10000.0, **kwargs):
        super().__init__(**kwargs)
        if max_length is not None and (
            not isinstance(max_length, int) or max_length < 1
        ):
            raise ValueError(
                "max_length must be a positive integer or None. "
                f"Received: max_length={max_length}"
            )
        self.max_length = max_length
        self.base = float(base)
        self.supports_masking = True

    def call(self, inputs, start_index=0, check_length=True):
        d_model = inputs.shape[-1]
        length = _checks.static_dim(inputs, -2)
        if self.max_length is not None:
            start = start_index if isinstance(start_index, int) else None
            if (
                length is not None
                and start is not None
                and start + length > self.max_length
            ):
                raise ValueError(
                    "Sequence too long for this model: positions "
                    f"{start}..{start + length - 1} requested, "
                    f"max_length={self.max_length}. "
                    f"Received: inputs.shape={tuple(inputs.shape)}"
                )
            if check_length and (length is None or start is None):
                last = ops.shape(inputs)[-2] + start_index
                _checks.check_range(
                    ops.reshape(last, (1,)),
                    1,
                    self.max_length + 1,
                    "Sequence too long for this model: it ends at position {hi} "
                    f"(1-based), max_length={self.max_length}.",
                )
        # dtype given: inferring it from a dynamic length is a graph break
        # under torch.compile; int32 is what it infers for a length.
        positions = ops.arange(ops.shape(inputs)[-2], dtype="int32") + start_index
        pe = sinusoidal_table(positions, d_model, self.base)
        return inputs + ops.cast(pe, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"max_length": self.max_length, "base": self.base})
        return config
