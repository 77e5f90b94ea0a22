"""The Transformer's layers, one concern per module.

Names are imported when first used: a module of the package imports the
package first, and with it no other module.
"""

from keras_transformer import _lazy

_PUBLIC = {
    "MultiHeadAttention": "keras_transformer.layers.attention",
    "ScaledDotProductAttention": "keras_transformer.layers.attention",
    "DecoderBlock": "keras_transformer.layers.blocks",
    "EncoderBlock": "keras_transformer.layers.blocks",
    "Dropout": "keras_transformer.layers.dropout",
    "TokenEmbedding": "keras_transformer.layers.embedding",
    "causal_mask": "keras_transformer.layers.masks",
    "padding_mask": "keras_transformer.layers.masks",
    "SinusoidalEncoding": "keras_transformer.layers.position",
    "sinusoidal_table": "keras_transformer.layers.position",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = _lazy.attributes(__name__, _PUBLIC)
