"""Searching a model for translations (§6.1): the settings
(``SearchOptions``), greedy and beam search, and the step loop they share.

The searches know a model only through its public methods (``encode``,
``initial_cache``, ``decode_step``), never a translator or a tokenizer.
"""

from keras_transformer.search.decoding import beam_search, greedy_search, length_penalty
from keras_transformer.search.options import SearchOptions

__all__ = ["SearchOptions", "beam_search", "greedy_search", "length_penalty"]
