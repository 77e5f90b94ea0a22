"""Translators: one interface (``translate.base``) and its engines, the
Keras ``Translator`` (tokenizer + model + search in one ``.keras`` file) and
the ``CTranslate2Translator`` of an export folder; loading either from a path,
scoring with BLEU, and the attention maps of a translation.

Names are imported when first used: the CTranslate2 engine needs neither
Keras nor a backend, and importing this package must not bring them in.
"""

from keras_transformer import _lazy

_PUBLIC = {
    "AttentionMaps": "keras_transformer.translate.attention_maps",
    "attention_maps": "keras_transformer.translate.attention_maps",
    "CTranslate2Translator": "keras_transformer.translate.ctranslate2_translator",
    "load_ctranslate2": "keras_transformer.translate.ctranslate2_translator",
    "TranslatorBase": "keras_transformer.translate.base",
    "ModelFileError": "keras_transformer.translate.evaluation",
    "load_translator": "keras_transformer.translate.evaluation",
    "score": "keras_transformer.translate.evaluation",
    "Translator": "keras_transformer.translate.keras_translator",
    "inference_copy": "keras_transformer.translate.keras_translator",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = _lazy.attributes(__name__, _PUBLIC)
