"""The 0.3.0 path of ``keras_transformer.model.schedules``
(for one release, with a ``DeprecationWarning``)."""

from keras_transformer import _moved
from keras_transformer.model import schedules

_moved.alias(__name__, schedules)
