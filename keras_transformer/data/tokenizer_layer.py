"""A tokenizer as a Keras layer: what a ``.keras`` translator holds.

The layer has no weights; its files are its assets, so that a translator
saves to and loads from one ``.keras`` file on any backend. It answers the
``TextTokenizer`` contract by handing each call to ``self.text``, the
tokenizer of plain Python that the other engines (CTranslate2) run too, so
that both spell every text alike.
"""

import os

import keras

from keras_transformer.data.contract import TextTokenizer


class TokenizerLayer(TextTokenizer, keras.layers.Layer):
    """Base of the package's tokenizer layers.

    A subclass sets ``self.text`` (a ``TextTokenizer``, or None until its
    assets are read) and defines ``asset_names`` and ``_from_files(files)``
    (``files``: asset name -> bytes, returns the ``TextTokenizer``).
    """

    asset_names = ()

    def __init__(self, **kwargs):
        kwargs["trainable"] = False  # no weights: files
        super().__init__(**kwargs)
        self.text = None
        self.built = True

    def _from_files(self, files):
        raise NotImplementedError(f"{type(self).__name__} must define _from_files")

    def _set_files(self, files):
        self.text = self._from_files(files)

    # -- the contract, by the text tokenizer ---------------------------------------

    @property
    def has_vocabulary(self):
        return self.text is not None

    def _text(self):
        if self.text is None:
            raise ValueError(
                f"The tokenizer {self.name!r} has no vocabulary: a tokenizer "
                "loaded from a .keras file reads it from its assets "
                f"({', '.join(self.asset_names)}): are they missing from the "
                "archive?"
            )
        return self.text

    @property
    def kind(self):
        return self._text().kind

    @property
    def target_languages(self):
        return self._text().target_languages if self.text is not None else ()

    def tokenize(self, texts):
        return self._text().tokenize(texts)

    def tokenize_targets(self, texts):
        return self._text().tokenize_targets(texts)

    def detokenize(self, rows):
        return self._text().detokenize(rows)

    def source_pieces(self):
        return self._text().source_pieces()

    def target_pieces(self):
        return self._text().target_pieces()

    def vocabulary_size(self):
        return self._text().vocabulary_size()

    def id_to_token(self, i):
        return self._text().id_to_token(i)

    def token_to_id(self, piece):
        return self._text().token_to_id(piece)

    def export_files(self):
        return self._text().export_files()

    def export_settings(self):
        return self._text().export_settings()

    # -- Keras' assets --------------------------------------------------------------

    def _asset_files(self):
        """The files to save as assets, by asset name."""
        raise NotImplementedError(f"{type(self).__name__} must define _asset_files")

    def save_assets(self, dir_path):
        for name, data in self._asset_files().items():
            with open(os.path.join(dir_path, name), "wb") as file:
                file.write(data)

    def load_assets(self, dir_path):
        files = {}
        for name in self.asset_names:
            path = os.path.join(dir_path, name)
            if os.path.isfile(path):
                with open(path, "rb") as file:
                    files[name] = file.read()
        self._set_files(files)
