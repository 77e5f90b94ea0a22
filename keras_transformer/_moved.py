"""Module paths of 0.3.0 that moved in 0.4.0, still importable for one
release with a ``DeprecationWarning`` that names the new path.

``import keras_transformer.translator`` (or ``from keras_transformer.decoding
import beam_search``) finds the module at its new path and binds it under the
old name too, so old code and the new code share one module object (one
class ``Translator``, one registration with Keras).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# Old dotted path -> new dotted path.
MOVED = {
    "keras_transformer.allocator": "keras_transformer.trainer.allocator",
    "keras_transformer.attention_maps": "keras_transformer.translate.attention_maps",
    "keras_transformer.callbacks": "keras_transformer.trainer.callbacks",
    "keras_transformer.checkpoints": "keras_transformer.trainer.checkpoints",
    "keras_transformer.cluster": "keras_transformer.distribute.cluster",
    "keras_transformer.configs": "keras_transformer.model.config",
    "keras_transformer.decoding": "keras_transformer.search.decoding",
    "keras_transformer.evaluation": "keras_transformer.translate.evaluation",
    "keras_transformer.export.ctranslate2_translator": (
        "keras_transformer.translate.ctranslate2_translator"
    ),
    "keras_transformer.losses": "keras_transformer.model.losses",
    "keras_transformer.plotting": "keras_transformer.translate.plotting",
    "keras_transformer.schedules": "keras_transformer.model.schedules",
    "keras_transformer.search_options": "keras_transformer.search.options",
    "keras_transformer.translator": "keras_transformer.translate.keras_translator",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new):
        self.new = new

    def create_module(self, spec):
        return None  # a placeholder, replaced in exec_module

    def exec_module(self, module):
        warnings.warn(
            f"{module.__name__} moved to {self.new}; the old path goes away "
            "in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        # The import system returns what sys.modules holds after exec_module.
        sys.modules[module.__name__] = importlib.import_module(self.new)


class MovedModules(importlib.abc.MetaPathFinder):
    """Finds the old paths in ``MOVED`` (installed by the package's
    ``__init__``)."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install():
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
