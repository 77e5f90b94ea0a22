"""Searching a model for translations (§6.1): the settings
(``SearchOptions``, the defaults written once); one search loop
(``skeleton``) and its parts: what a step may emit (``emission``) and the
selection rules (``greedy``, ``one_beam``, ``transformers_beam``,
``constrained``: terminology); ``greedy_search`` and ``beam_search`` over
them (``decoding``); the step and its cache, and the widths a compiled
search is built for.

The searches know a model only through its public methods (``encode``,
``initial_cache``, ``decode_step``), never a translator or a tokenizer.
Names are imported when first used: ``search.options`` needs no Keras.
"""

from keras_transformer import _lazy

_PUBLIC = {
    "SearchOptions": "keras_transformer.search.options",
    "beam_search": "keras_transformer.search.decoding",
    "greedy_search": "keras_transformer.search.decoding",
    "length_penalty": "keras_transformer.search.options",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = _lazy.attributes(__name__, _PUBLIC)
