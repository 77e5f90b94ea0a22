"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Runs on TensorFlow, JAX and PyTorch (choose with ``KERAS_BACKEND``).
Importing it changes nothing outside it: process-wide settings (logging, the
allocator) are the commands' choice, made in their ``main``.

The subsystems, top down: ``cli`` (the commands) over ``serving`` and
``export``, over ``trainer`` and ``translate`` (the translator interface and
its engines), over ``pretrained`` (checkpoints trained elsewhere), over
``search`` (greedy and beam search), ``model`` (Figure 1),
``layers`` (§3), ``data``, ``distribute`` and the private ``_guards``.
``docs/design.md`` draws the graph.
"""

import importlib as _importlib
import os as _os
import sys as _sys
import types as _types
import warnings as _warnings

from keras_transformer import _lazy, _moved

__version__ = "0.4.0.dev0"

# The public API: each name and the module that defines it.
_PUBLIC = {
    "AttentionMaps": "keras_transformer.translate.attention_maps",
    "attention_maps": "keras_transformer.translate.attention_maps",
    "CONFIGS": "keras_transformer.model.config",
    "TransformerConfig": "keras_transformer.model.config",
    "transformer_config": "keras_transformer.model.config",
    "beam_search": "keras_transformer.search.decoding",
    "greedy_search": "keras_transformer.search.decoding",
    "length_penalty": "keras_transformer.search.options",
    "DataParallelSetup": "keras_transformer.distribute.parallel",
    "data_parallel": "keras_transformer.distribute.parallel",
    "model_parallel": "keras_transformer.distribute.parallel",
    "DecoderBlock": "keras_transformer.layers.blocks",
    "EncoderBlock": "keras_transformer.layers.blocks",
    "Dropout": "keras_transformer.layers.dropout",
    "MultiHeadAttention": "keras_transformer.layers.attention",
    "ScaledDotProductAttention": "keras_transformer.layers.attention",
    "SinusoidalEncoding": "keras_transformer.layers.position",
    "sinusoidal_table": "keras_transformer.layers.position",
    "TokenEmbedding": "keras_transformer.layers.embedding",
    "causal_mask": "keras_transformer.layers.masks",
    "padding_mask": "keras_transformer.layers.masks",
    "LabelSmoothedCrossEntropy": "keras_transformer.model.losses",
    "MaskedAccuracy": "keras_transformer.model.losses",
    "Transformer": "keras_transformer.model.transformer",
    "build_model": "keras_transformer.model.transformer",
    "TransformerSchedule": "keras_transformer.model.schedules",
    "transformer_optimizer": "keras_transformer.model.schedules",
    "SearchOptions": "keras_transformer.search.options",
    "Translator": "keras_transformer.translate.keras_translator",
    "inference_copy": "keras_transformer.translate.keras_translator",
    "TranslatorBase": "keras_transformer.translate.base",
    "MarianTokenizer": "keras_transformer.pretrained.marian_tokenizer",
}

__all__ = sorted(_PUBLIC)

# Old names kept for one release: name -> (module, replacement in words).
_DEPRECATED = {
    "keep_freed_memory": (
        "keras_transformer.trainer.allocator",
        "keras_transformer.trainer.allocator.keep_freed_memory (it changes the "
        "whole process's allocator: a program's choice, not the model's)",
    ),
}

# Commands that import what they need themselves, after quieting the
# frameworks' start-up lines: kt-translate and kt-serve may translate without
# Keras (given a CTranslate2 export); kt-import's one-line errors would
# otherwise follow TensorFlow's; kt-launch only starts and watches kt-train
# processes, for the whole run, and needs no framework of its own. Script
# name: module under keras_transformer.cli.
_COMMANDS_STARTING_LATE = {
    "kt-translate": "translate",
    "kt-serve": "serve",
    "kt-import": "import_checkpoint",
    "kt-launch": "launch",
}

_moved.install()


class _Package(_types.ModuleType):
    """This package's module type: the import system binds a submodule as
    an attribute of its package once imported, and an old module path named
    like a public function (``import keras_transformer.attention_maps``, a
    module of 0.3.0) must not hide the function."""

    def __setattr__(self, name, value):
        moved = isinstance(value, _types.ModuleType) and (
            value.__name__ != f"{self.__name__}.{name}"
        )
        if not (moved and name in _PUBLIC):
            super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


_public_attribute, __dir__ = _lazy.attributes(__name__, _PUBLIC)


def __getattr__(name):
    if name == "get_config":  # the configs' old name, without a warning
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


def _import_public_api():
    """Import every public module: Keras finds a saved object's class only
    if it is registered, so ``keras.saving.load_model`` works after a bare
    ``import keras_transformer``."""
    for module in dict.fromkeys(_PUBLIC.values()):
        _importlib.import_module(module)


def _starting_a_command_that_imports_late():
    """Whether this process is one of ``_COMMANDS_STARTING_LATE`` (the
    installed script, or ``python -m keras_transformer.cli.translate``)."""
    script = _os.path.basename(_sys.argv[0]) if _sys.argv else ""
    if script in _COMMANDS_STARTING_LATE:
        return True
    # Under -m, sys.argv[0] is "-m" while the package imports.
    argv = list(getattr(_sys, "orig_argv", ()))
    if "-m" in argv[:-1]:
        module = argv[argv.index("-m") + 1]
        modules = _COMMANDS_STARTING_LATE.values()
        return module in {f"{__name__}.cli.{name}" for name in modules}
    return False


if not _starting_a_command_that_imports_late():
    _import_public_api()
