"""Training on several devices (data and model parallelism) and on several
JAX processes (``cluster``)."""

from keras_transformer.distribute.parallel import (
    DataParallelSetup,
    data_parallel,
    model_parallel,
)

__all__ = ["DataParallelSetup", "data_parallel", "model_parallel"]
