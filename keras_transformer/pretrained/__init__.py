"""Checkpoints trained elsewhere, read into this package's Transformer.

``marian``: Marian / OPUS-MT checkpoints in Hugging Face's folder layout
(``config.json``, ``model.safetensors``), read with NumPy and ``safetensors``
alone, mapped onto the paper's architecture with the config fields that
express their differences.

Names are imported when first used: a module of the package imports the
package first, and with it no other module.
"""

from keras_transformer import _lazy

_PUBLIC = {
    "MarianTokenizer": "keras_transformer.pretrained.marian_tokenizer",
    "marian_transformer": "keras_transformer.pretrained.marian",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = _lazy.attributes(__name__, _PUBLIC)
