"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Runs on TensorFlow, JAX and PyTorch (choose with ``KERAS_BACKEND``).
Importing it changes nothing outside it: process-wide settings (logging, the
allocator) are the commands' choice, made in their ``main``.
"""

import warnings as _warnings

from keras_transformer.attention_maps import AttentionMaps, attention_maps
from keras_transformer.configs import CONFIGS, TransformerConfig, transformer_config
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
from keras_transformer.model import Transformer, build_model
from keras_transformer.schedules import TransformerSchedule, transformer_optimizer
from keras_transformer.search_options import SearchOptions
from keras_transformer.translator import Translator, inference_copy

__version__ = "0.3.0"

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
    "SearchOptions",
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
    "greedy_search",
    "inference_copy",
    "length_penalty",
    "padding_mask",
    "sinusoidal_table",
    "transformer_config",
    "transformer_optimizer",
]


def __getattr__(name):
    """Names that moved, still reachable with a ``DeprecationWarning``."""
    if name == "get_config":
        from keras_transformer.configs import get_config

        return get_config
    if name == "keep_freed_memory":
        _warnings.warn(
            "keras_transformer.keep_freed_memory moved to "
            "keras_transformer.allocator.keep_freed_memory (it changes the "
            "whole process's allocator: a program's choice, not the model's).",
            DeprecationWarning,
            stacklevel=2,
        )
        from keras_transformer.allocator import keep_freed_memory

        return keep_freed_memory
    raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
