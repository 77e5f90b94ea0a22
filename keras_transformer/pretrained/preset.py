"""A pretrained checkpoint folder as a tokenizer, a Transformer and the
search its generation config asks for."""

import json
import os

from keras_transformer.data.languages import languages_of_name
from keras_transformer.pretrained.marian import marian_transformer
from keras_transformer.pretrained.marian_tokenizer import (
    UNKNOWN,
    VOCABULARY,
    MarianTokenizer,
)
from keras_transformer.search.options import SearchOptions


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


# transformers' defaults for what a generation config leaves out.
GENERATION_DEFAULTS = {"num_beams": 1, "length_penalty": 1.0}


def generation_search(folder, max_length):
    """``(SearchOptions, max_output_length)``: how transformers' ``generate``
    searches with the checkpoint, from its ``generation_config.json`` (or,
    in older checkpoints, the same keys in ``config.json``): its beam size,
    its length penalty in transformers' form, and its ``max_length`` (which
    counts the start token) less one, at most the model's ``max_length``.
    Without either, transformers' defaults: greedy search, α = 1, and the
    paper's source length + 50 for want of a limit."""
    settings = {}
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as file:
                settings.update(json.load(file))
    try:
        search = SearchOptions(
            beam_size=settings.get("num_beams") or GENERATION_DEFAULTS["num_beams"],
            length_penalty=settings.get(
                "length_penalty", GENERATION_DEFAULTS["length_penalty"]
            ),
            length_penalty_form="transformers",
        )
    except (TypeError, ValueError) as error:
        raise ValueError(f"{folder}: its generation config: {error}") from None
    limit = settings.get("max_length")
    limit = None if limit is None else min(int(limit) - 1, max_length)
    return search, limit


def checkpoint_languages(folder):
    """``(source, target)`` of a checkpoint: its ``tokenizer_config.json``'s
    ``source_lang`` and ``target_lang`` where both are set, else its
    folder's name in OPUS-MT's style (a Hugging Face cache folder's
    ``models--Helsinki-NLP--opus-mt-de-en/snapshots/<hash>`` included), else
    None."""
    path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
        pair = config.get("source_lang"), config.get("target_lang")
        if all(isinstance(code, str) and code for code in pair):
            return pair
    for part in reversed(os.path.normpath(os.path.abspath(folder)).split(os.sep)):
        pair = languages_of_name(part)
        if pair is not None:
            return pair
    return None
