"""The 0.3.0 path of ``keras_transformer.translate.plotting``
(for one release, with a ``DeprecationWarning``)."""

from keras_transformer import _moved
from keras_transformer.translate import plotting

_moved.alias(__name__, plotting)
