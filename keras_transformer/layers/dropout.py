"""Dropout (§5.4) whose random bits are a hash of each element's position.

``keras.layers.Dropout`` on JAX draws its mask with ``jax.random``'s
Threefry generator: 20 rounds of mixing per 32 random bits, which makes
drawing the masks a large share of a training step on the CPU
(docs/results.md, "Step speed"). Here each element's bits are a 32-bit
integer hash of its flat index, keyed by the layer's seed: a handful of
multiplies, shifts and xors that XLA fuses into the select that applies the
mask.

A hash of (key, index) is a counter-based generator, the idea behind
Threefry and Philox themselves, with fewer rounds: enough for dropout, whose
masks only need to be balanced, uncorrelated between elements and new at
every step (``tests/test_dropout.py`` checks each), not for cryptography or
for Monte Carlo estimates.

Only the JAX backend takes this path: TensorFlow without XLA would run the
hash as a dozen separate kernels, each a pass over memory, and PyTorch's
eager ``dropout`` is already one fused kernel. Both keep Keras' dropout.
"""

import keras
from keras import ops

# Wellons' "lowbias32" (hash-prospector): multipliers and shifts chosen by
# search so that every input bit flips each output bit with probability near
# 1/2.
_MULTIPLIERS = (0x21F0AAAD, 0x735A2D97)
_SHIFTS = (16, 15, 15)
_GOLDEN = 0x9E3779B9  # 2^32 / φ: spreads consecutive counters apart


def _u32(value):
    return ops.convert_to_tensor(value, dtype="uint32")


def mix32(h):
    """A bijective hash of uint32 values: xor-shift, multiply, twice."""
    h = ops.bitwise_xor(h, ops.right_shift(h, _u32(_SHIFTS[0])))
    h = ops.multiply(h, _u32(_MULTIPLIERS[0]))
    h = ops.bitwise_xor(h, ops.right_shift(h, _u32(_SHIFTS[1])))
    h = ops.multiply(h, _u32(_MULTIPLIERS[1]))
    return ops.bitwise_xor(h, ops.right_shift(h, _u32(_SHIFTS[2])))


def hashed_bits(seed, shape):
    """uint32 bits of ``shape``, one word per element, from a (2,) seed.

    Keras' seed generators hand out ``[seed, counter]`` with the counter
    stepped at every draw; both words go into the key, so every layer and
    every step gets its own stream. The key enters each element twice (before
    and between two rounds of the hash), so that two keys do not give the
    same bits shifted by a few positions.
    """
    if keras.backend.backend() == "torch":
        raise NotImplementedError(
            "hashed_bits needs wrapping uint32 arithmetic, which Keras' torch "
            "backend does not give (it computes uint32 as int64); "
            "kt.layers.Dropout uses PyTorch's own dropout there."
        )
    seed = ops.cast(seed, "uint32")
    key = mix32(ops.bitwise_xor(seed[0], mix32(ops.add(seed[1], _u32(_GOLDEN)))))
    size = 1
    for dim in shape:
        size *= dim
    index = ops.reshape(ops.arange(size, dtype="uint32"), shape)
    return mix32(ops.add(mix32(ops.bitwise_xor(index, key)), key))


def hashed_dropout(inputs, rate, seed):
    """``inputs`` with a ``rate`` fraction of elements zeroed, the rest scaled
    by ``1 / (1 - rate)`` (as Keras' dropout), the mask from ``hashed_bits``.

    An element is dropped when its 32 bits, read as an integer, fall below
    ``rate · 2^32``: the drop probability is ``rate`` to within 2^-32.
    """
    threshold = _u32(min(round(rate * 2**32), 2**32 - 1))
    keep = ops.greater_equal(hashed_bits(seed, tuple(inputs.shape)), threshold)
    scaled = ops.divide(inputs, ops.cast(1.0 - rate, inputs.dtype))
    return ops.where(keep, scaled, ops.zeros_like(inputs))


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """``keras.layers.Dropout`` with a hashed mask on the JAX backend.

    Same arguments, config, seeds and behaviour as Keras' layer (the seed
    generator's state advances once per training call); only where the bits
    come from differs on JAX. ``noise_shape`` (a mask shared along some axes)
    falls back to Keras' dropout.
    """

    def call(self, inputs, training=False):
        if (
            not training
            or self.rate == 0
            or self.noise_shape is not None
            or keras.backend.backend() != "jax"
        ):
            return super().call(inputs, training=training)
        if self.rate == 1:
            return ops.zeros_like(inputs)
        return hashed_dropout(inputs, self.rate, self.seed_generator.next())
