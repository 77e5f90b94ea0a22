"""The 0.3.0 path of ``keras_transformer.search.options``
(for one release, with a ``DeprecationWarning``)."""

from keras_transformer import _moved
from keras_transformer.search import options

_moved.alias(__name__, options)
