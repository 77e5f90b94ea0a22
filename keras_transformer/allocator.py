"""The 0.3.0 path of ``keras_transformer.trainer.allocator``
(for one release, with a ``DeprecationWarning``)."""

from keras_transformer import _moved
from keras_transformer.trainer import allocator

_moved.alias(__name__, allocator)
