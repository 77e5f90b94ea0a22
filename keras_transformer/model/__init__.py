"""The model of Figure 1: its named configurations (Table 3), the
``Transformer`` itself, the training loss (§5.4) and the learning-rate
schedule with Adam (§5.3)."""

from keras_transformer.model.config import (
    CONFIGS,
    TransformerConfig,
    transformer_config,
)
from keras_transformer.model.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model.schedules import TransformerSchedule, transformer_optimizer
from keras_transformer.model.transformer import Transformer, build_model

__all__ = [
    "CONFIGS",
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "Transformer",
    "TransformerConfig",
    "TransformerSchedule",
    "build_model",
    "transformer_config",
    "transformer_optimizer",
]
