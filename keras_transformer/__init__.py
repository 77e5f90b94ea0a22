"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Runs on TensorFlow, JAX and PyTorch (choose with ``KERAS_BACKEND``).
Importing it imports neither Keras nor a backend: each public name is
imported when first used (PEP 562). Its classes are registered with Keras
as soon as Keras is imported too, in either order (``saving``), so
``keras.saving.load_model`` finds them as it finds keras-hub's. Importing it
changes nothing else outside it: process-wide settings (logging, the
allocator) are the commands' choice, made in their ``main``.

The subsystems, top down: ``cli`` (the commands) over ``serving`` and
``export``, over ``trainer`` and ``translate`` (the translator interface and
its engines), over ``pretrained`` (checkpoints trained elsewhere), over
``search`` (greedy and beam search), ``model`` (Figure 1),
``layers`` (§3), ``data``, ``distribute`` and the private ``_guards``.
``docs/design.md`` draws the graph.
"""

import importlib as _importlib
import warnings as _warnings

from keras_transformer import _lazy, saving

__version__ = "0.4.0.dev0"

# The public API, from the subpackages' own tables (name -> the module that
# defines it): every name of a subpackage ("*"), or the ones listed.
_API = {
    "keras_transformer.layers": "*",
    "keras_transformer.model": "*",
    "keras_transformer.search": "*",
    "keras_transformer.distribute": (
        "DataParallelSetup",
        "data_parallel",
        "model_parallel",
    ),
    "keras_transformer.translate": (
        "AttentionMaps",
        "attention_maps",
        "Translator",
        "TranslatorBase",
        "inference_copy",
    ),
    "keras_transformer.pretrained": ("MarianTokenizer",),
}
_PUBLIC = _lazy.gather(_API)
_PUBLIC["load_model"] = "keras_transformer.saving"

__all__ = sorted(_PUBLIC)

# Old names kept for one release: name -> (module, replacement in words).
_DEPRECATED = {
    "keep_freed_memory": (
        "keras_transformer.trainer.allocator",
        "keras_transformer.trainer.allocator.keep_freed_memory (it changes the "
        "whole process's allocator: a program's choice, not the model's)",
    ),
}

_public_attribute, __dir__ = _lazy.attributes(__name__, _PUBLIC)


def __getattr__(name):
    if name == "get_config":  # 0.2.0's name of transformer_config; warns when called
        from keras_transformer.model.config import get_config

        return get_config
    if name in _DEPRECATED:
        module, replacement = _DEPRECATED[name]
        _warnings.warn(
            f"keras_transformer.{name} moved to {replacement}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_importlib.import_module(module), name)
    return _public_attribute(name)


saving.watch()
