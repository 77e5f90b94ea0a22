"""A pretrained checkpoint folder as a tokenizer and a Transformer."""

import json
import os

from keras_transformer.pretrained.marian import marian_transformer
from keras_transformer.pretrained.marian_tokenizer import (
    UNKNOWN,
    VOCABULARY,
    MarianTokenizer,
)


def marian_parts(folder, dtype=None):
    """``(MarianTokenizer, Transformer)`` of a Marian checkpoint folder
    (``config.json``, the weights, ``source.spm``, ``target.spm``,
    ``vocab.json``)."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: no such checkpoint folder")
    path = os.path.join(folder, VOCABULARY)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no {VOCABULARY}; a Marian tokenizer needs it")
    with open(path, encoding="utf-8") as file:
        unk_id = json.load(file).get(UNKNOWN)
    if unk_id is None:
        raise ValueError(f"{path} has no {UNKNOWN} piece")
    transformer, checkpoint = marian_transformer(folder, unk_id=unk_id, dtype=dtype)
    tokenizer = MarianTokenizer(checkpoint.special, checkpoint.sizes, folder=folder)
    return tokenizer, transformer
