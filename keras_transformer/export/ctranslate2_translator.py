"""The 0.3.0 path of ``keras_transformer.translate.ctranslate2_translator``
(for one release, with a ``DeprecationWarning``)."""

from keras_transformer import _moved
from keras_transformer.translate import ctranslate2_translator

_moved.alias(__name__, ctranslate2_translator)
