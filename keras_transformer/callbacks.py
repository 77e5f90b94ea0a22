"""The 0.3.0 path of ``keras_transformer.trainer.callbacks``
(for one release, with a ``DeprecationWarning``)."""

from keras_transformer import _moved
from keras_transformer.trainer import callbacks

_moved.alias(__name__, callbacks)
