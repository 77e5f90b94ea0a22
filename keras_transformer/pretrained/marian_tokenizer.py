"""``MarianTokenizer``: a Marian checkpoint's tokenizer as a Keras layer.

It holds a ``MarianVocabularies`` (``marian_vocabularies``: the two
SentencePiece models and ``vocab.json``, mapped onto this package's ids)
and saves its files as assets, so that a translator that holds it saves to
and loads from a ``.keras`` file like any other.
"""

import os

import keras

from keras_transformer.data.tokenizer_layer import TokenizerLayer
from keras_transformer.pretrained.marian_vocabularies import (
    FILES,
    SOURCE_MODEL,
    TARGET_MODEL,
    TARGET_VOCABULARY,
    UNKNOWN,
    VOCABULARY,
    MarianVocabularies,
)

__all__ = [
    "SOURCE_MODEL",
    "TARGET_MODEL",
    "TARGET_VOCABULARY",
    "UNKNOWN",
    "VOCABULARY",
    "MarianTokenizer",
]


@keras.saving.register_keras_serializable(package="keras_transformer")
class MarianTokenizer(TokenizerLayer):
    """Texts to this package's ids and back, with a Marian checkpoint's files.

    Args:
        special: Marian's ids ``{"pad", "start", "end", "unk"}`` (the
            checkpoint's config and ``vocab.json``'s ``<unk>``).
        sizes: the model's source and target vocabulary sizes in Marian's
            ids (``vocab_size``, ``decoder_vocab_size``), which the order of
            the ids depends on.
        folder: the checkpoint folder to read the files from (None when the
            layer is loaded from a ``.keras`` file: ``load_assets`` reads
            them).
        **kwargs: base layer arguments.

    It answers the ``TextTokenizer`` contract; ``tokenize_targets`` spells a
    fine-tuning corpus's translations with ``target.spm``.
    """

    asset_names = FILES

    def __init__(self, special, sizes, folder=None, **kwargs):
        super().__init__(**kwargs)
        self.special = {
            name: int(special[name]) for name in ("pad", "start", "end", "unk")
        }
        self.sizes = tuple(int(size) for size in sizes)
        if folder is not None:
            self._set_files(_read(folder))

    def _from_files(self, files):
        if not all(name in files for name in (SOURCE_MODEL, TARGET_MODEL, VOCABULARY)):
            return None
        return MarianVocabularies(files, self.special, self.sizes)

    def _asset_files(self):
        return self._text().export_files()

    def get_config(self):
        config = super().get_config()
        config.update(special=self.special, sizes=list(self.sizes))
        return config


def _read(folder):
    files = {}
    for name in FILES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, "rb") as file:
                files[name] = file.read()
        elif name != TARGET_VOCABULARY:
            raise FileNotFoundError(f"{path}: no {name}; a Marian tokenizer needs it")
    return files
