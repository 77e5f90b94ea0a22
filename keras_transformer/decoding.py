"""The 0.3.0 path of ``keras_transformer.search.decoding``
(for one release, with a ``DeprecationWarning``)."""

from keras_transformer import _moved
from keras_transformer.search import decoding

_moved.alias(__name__, decoding)
