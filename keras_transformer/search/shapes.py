"""The widths a compiled search is built for.

Sources and outputs are padded to widths 8, 16, 32, ... (capped by the
model's ``max_length``), so that a new input length rarely means a new
compilation of the search; the Keras translator pads to them, its warm-up
compiles each, and the SavedModel export traces one search per output width.
``attention_maps`` pads a source to them as well, and its decoder input to
the model's whole width (one program per source width,
``Translator.warm_up_attention``).
"""

from keras_transformer.data.batching import bucket_length

_RULE = {"min_length": 8, "step": 2, "multiple": 8}


def width(length, max_length=None):
    """The padded width of a sequence of ``length`` tokens."""
    return bucket_length(length, max_length, **_RULE)


def widths(max_length):
    """Every width up to ``max_length``, in order."""
    return sorted({width(n, max_length) for n in range(1, max_length + 1)})


def constraint_width(tokens):
    """The padded width of ``tokens`` constraint tokens (8, 16, 32, ...): a
    constrained search is compiled once per width, not per glossary."""
    return bucket_length(max(tokens, 1), None, **_RULE)
