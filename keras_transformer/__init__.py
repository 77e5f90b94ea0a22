"""keras_transformer: the Transformer of "Attention Is All You Need" in Keras 3.

Runs on TensorFlow, JAX and PyTorch (choose with ``KERAS_BACKEND``).
Importing it imports nothing more, neither Keras nor a backend: each public
name is imported when first used (PEP 562). ``kt.load_model`` loads a
``.keras`` file; a name that needs Keras also registers the package's
classes with Keras (``saving.register``), so that ``keras.saving.load_model``
finds them after, say, ``kt.build_model``. Importing it changes nothing
outside it: process-wide settings (logging, the allocator) are the
commands' choice, made in their ``main``.

The subsystems, top down: ``cli`` (the commands) over ``serving`` and
``export``, over ``trainer`` and ``translate`` (the translator interface and
its engines), over ``pretrained`` (checkpoints trained elsewhere), over
``search`` (greedy and beam search), ``model`` (Figure 1),
``layers`` (§3), ``data``, ``distribute`` and the private ``_guards``.
``docs/design.md`` draws the graph.
"""

import importlib as _importlib
import warnings as _warnings

from keras_transformer import _lazy

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
    "load_model": "keras_transformer.saving",
}

# The modules above that import neither Keras nor a backend: their names
# leave Keras unimported (a CTranslate2 engine's caller, a server parsing
# its search settings).
_WITHOUT_KERAS = frozenset(
    {
        "keras_transformer.model.config",
        "keras_transformer.saving",
        "keras_transformer.search.options",
        "keras_transformer.translate.base",
    }
)

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
    module = _PUBLIC.get(name)
    if module is not None and module not in _WITHOUT_KERAS:
        from keras_transformer import saving

        saving.register()
    return _public_attribute(name)
