"""Loading ``.keras`` files: Keras finds a saved object's class
(``keras_transformer>Translator``, ``keras_transformer>Transformer``, ...)
only once the module that registers it has been imported, and it imports
no module of another package by itself. ``import keras_transformer``
imports nothing, so these modules are imported here, on demand.

    import keras_transformer as kt
    translator = kt.load_model("runs/numbers/translator.keras")

Resolving a public name that needs Keras (``kt.build_model``, ...) calls
``register()`` too, so ``keras.saving.load_model`` works after it as it
always did.
"""

import importlib

# Every module that registers a class with Keras
# (``@keras.saving.register_keras_serializable``). Named, and imported only
# when ``register()`` runs: this module imports nothing of the package, so
# any module may call it (the translator loader in ``translate.evaluation``
# does). ``tests/test_lazy_import.py`` checks the list against the sources.
REGISTERING = (
    "keras_transformer.data.sentencepiece_layer",
    "keras_transformer.layers.attention",
    "keras_transformer.layers.blocks",
    "keras_transformer.layers.dropout",
    "keras_transformer.layers.embedding",
    "keras_transformer.layers.position",
    "keras_transformer.model.losses",
    "keras_transformer.model.schedules",
    "keras_transformer.model.transformer",
    "keras_transformer.pretrained.marian_tokenizer",
    "keras_transformer.translate.keras_translator",
)

_registered = False


def register():
    """Register every class of this package with Keras, by importing the
    modules that define them (and with them Keras and its backend).

    Idempotent; after the first call, a flag's look-up.
    """
    global _registered
    if not _registered:
        for module in REGISTERING:
            importlib.import_module(module)
        _registered = True


def load_model(filepath, **kwargs):
    """``keras.saving.load_model(filepath, **kwargs)`` with this package's
    classes registered first: a translator, a ``Transformer`` or any model
    holding this package's layers, losses or schedules.

    Args:
        filepath: str or path-like, a ``.keras`` file (or what Keras' own
            ``load_model`` takes).
        **kwargs: passed to ``keras.saving.load_model`` (``custom_objects``,
            ``compile``, ``safe_mode``).

    Returns:
        The saved object (a ``Translator`` for a ``translator.keras``).
    """
    register()
    import keras

    return keras.saving.load_model(filepath, **kwargs)
