"""Translators: one interface (``translate.base``) and its engines, the
Keras ``Translator`` (tokenizer + model + search in one ``.keras`` file) and
the ``CTranslate2Translator`` of an export folder; loading either from a path,
scoring with BLEU, and the attention maps of a translation.

Names are imported when first used: the CTranslate2 engine needs neither
Keras nor a backend, and importing this package must not bring them in.
"""

import importlib

_PUBLIC = {
    "AttentionMaps": "keras_transformer.translate.attention_maps",
    "attention_maps": "keras_transformer.translate.attention_maps",
    "CTranslate2Translator": "keras_transformer.translate.ctranslate2_translator",
    "load_ctranslate2": "keras_transformer.translate.ctranslate2_translator",
    "ModelFileError": "keras_transformer.translate.evaluation",
    "load_translator": "keras_transformer.translate.evaluation",
    "score": "keras_transformer.translate.evaluation",
    "Translator": "keras_transformer.translate.keras_translator",
    "inference_copy": "keras_transformer.translate.keras_translator",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(
            f"module 'keras_transformer.translate' has no attribute {name!r}"
        )
    return getattr(importlib.import_module(module), name)


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
