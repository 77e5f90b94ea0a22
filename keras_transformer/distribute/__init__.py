"""Training on several devices (data and model parallelism) and on several
JAX processes (``cluster``).

Names are imported when first used: a module of the package imports the
package first, and with it no other module.
"""

from keras_transformer import _lazy

_PUBLIC = {
    "DataParallelSetup": "keras_transformer.distribute.parallel",
    "data_parallel": "keras_transformer.distribute.parallel",
    "model_parallel": "keras_transformer.distribute.parallel",
    "weight_bytes": "keras_transformer.distribute.parallel",
    "weight_bytes_per_device": "keras_transformer.distribute.parallel",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = _lazy.attributes(__name__, _PUBLIC)
