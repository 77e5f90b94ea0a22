"""Checkpoints trained elsewhere, read into this package's Transformer.

``marian``: Marian / OPUS-MT checkpoints in Hugging Face's folder layout
(``config.json``, ``model.safetensors``), read with NumPy and ``safetensors``
alone, mapped onto the paper's architecture with the config fields that
express their differences.
"""
