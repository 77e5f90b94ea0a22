"""The model of Figure 1: its named configurations (Table 3), the
``Transformer`` itself, the training loss (§5.4) and the learning-rate
schedule with Adam (§5.3).

Names are imported when first used: the configurations need no Keras.
"""

from keras_transformer import _lazy

_PUBLIC = {
    "CONFIGS": "keras_transformer.model.config",
    "TransformerConfig": "keras_transformer.model.config",
    "transformer_config": "keras_transformer.model.config",
    "LabelSmoothedCrossEntropy": "keras_transformer.model.losses",
    "MaskedAccuracy": "keras_transformer.model.losses",
    "TransformerSchedule": "keras_transformer.model.schedules",
    "transformer_optimizer": "keras_transformer.model.schedules",
    "Transformer": "keras_transformer.model.transformer",
    "build_model": "keras_transformer.model.transformer",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = _lazy.attributes(__name__, _PUBLIC)
