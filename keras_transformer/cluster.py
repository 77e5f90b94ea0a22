"""The 0.3.0 path of ``keras_transformer.distribute.cluster``
(for one release, with a ``DeprecationWarning``)."""

from keras_transformer import _moved
from keras_transformer.distribute import cluster

_moved.alias(__name__, cluster)
