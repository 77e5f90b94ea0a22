"""The Transformer's layers, one concern per module."""

from keras_transformer.layers.attention import (
    MultiHeadAttention,
    ScaledDotProductAttention,
)
from keras_transformer.layers.blocks import DecoderBlock, EncoderBlock
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.embedding import TokenEmbedding
from keras_transformer.layers.position import SinusoidalEncoding, sinusoidal_table

__all__ = [
    "DecoderBlock",
    "Dropout",
    "EncoderBlock",
    "MultiHeadAttention",
    "ScaledDotProductAttention",
    "SinusoidalEncoding",
    "TokenEmbedding",
    "sinusoidal_table",
]
