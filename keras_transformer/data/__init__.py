"""Data for training and evaluation: the built-in number-translation task."""

from keras_transformer.data.numbers import (
    LIMIT,
    english,
    german,
    make_splits,
    sample_numbers,
)

__all__ = ["LIMIT", "english", "german", "make_splits", "sample_numbers"]
