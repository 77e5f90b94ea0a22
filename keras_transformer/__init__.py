"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Runs on TensorFlow, JAX and PyTorch (choose with ``KERAS_BACKEND``).
"""

from keras_transformer.allocator import keep_freed_memory
from keras_transformer.attention_maps import AttentionMaps, attention_maps
from keras_transformer.decoding import beam_search, greedy_search, length_penalty
from keras_transformer.distribute import (
    DataParallelSetup,
    data_parallel,
    model_parallel,
)
from keras_transformer.layers import (
    DecoderBlock,
    Dropout,
    EncoderBlock,
    MultiHeadAttention,
    ScaledDotProductAttention,
    SinusoidalEncoding,
    TokenEmbedding,
    sinusoidal_table,
)
from keras_transformer.layers.masks import causal_mask, padding_mask
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import (
    CONFIGS,
    Transformer,
    TransformerConfig,
    build_model,
    get_config,
)
from keras_transformer.schedules import TransformerSchedule, transformer_optimizer
from keras_transformer.translator import Translator

__version__ = "0.2.0"

__all__ = [
    "AttentionMaps",
    "CONFIGS",
    "DataParallelSetup",
    "DecoderBlock",
    "Dropout",
    "EncoderBlock",
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "MultiHeadAttention",
    "ScaledDotProductAttention",
    "SinusoidalEncoding",
    "TokenEmbedding",
    "Transformer",
    "TransformerConfig",
    "TransformerSchedule",
    "Translator",
    "attention_maps",
    "beam_search",
    "build_model",
    "causal_mask",
    "data_parallel",
    "model_parallel",
    "get_config",
    "greedy_search",
    "keep_freed_memory",
    "length_penalty",
    "padding_mask",
    "sinusoidal_table",
    "transformer_optimizer",
]
