"""The 0.3.0 path of ``keras_transformer.translate.evaluation``
(for one release, with a ``DeprecationWarning``)."""

from keras_transformer import _moved
from keras_transformer.translate import evaluation

_moved.alias(__name__, evaluation)
