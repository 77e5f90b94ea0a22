"""``SentencePieceTokenizer``: the package's SentencePiece model as a Keras
layer, on the ``sentencepiece`` package alone (no TensorFlow, no keras-hub).

It saves its model as the asset ``vocabulary.spm``, as keras-hub's layer of
the same name did, and reads the files that layer wrote: the ``.keras``
translators of 0.1.0 to 0.3.0 name ``keras_hub>SentencePieceTokenizer``,
and ``Translator.from_config`` reads that name as this class
(``OLD_NAMES``), in a custom-object scope, which Keras consults before the
names registered by any library (keras-hub's own included, where it is
installed).
"""

import keras

from keras_transformer.data.sentencepiece import SentencePiece
from keras_transformer.data.tokenizer_layer import TokenizerLayer

ASSET = "vocabulary.spm"
# keras-hub's settings of the files 0.1.0 to 0.3.0 wrote, all at their
# defaults there: a file that set them otherwise is refused by name.
_KERAS_HUB_DEFAULTS = {
    "proto": None,
    "sequence_length": None,
    "add_bos": False,
    "add_eos": False,
    "config_file": "tokenizer.json",
}


@keras.saving.register_keras_serializable(package="keras_transformer")
class SentencePieceTokenizer(TokenizerLayer):
    """The package's tokenizer: one SentencePiece model for both sides,
    whose piece ids are the model's ids.

    Args:
        proto: the model's bytes (``train_tokenizer``'s), or None (a layer
            loaded from a ``.keras`` file reads its asset).
        **kwargs: base layer arguments (``name``, ...).

    It answers the ``TextTokenizer`` contract (``encode``, ``decode``,
    ``count``, ``source_pieces``, ...) and keeps keras-hub's calls
    (``tokenize``, ``detokenize``, ``vocabulary_size``, ``id_to_token``,
    ``token_to_id``), which return Python lists on every backend.
    """

    asset_names = (ASSET,)

    def __init__(self, proto=None, **kwargs):
        for key, default in _KERAS_HUB_DEFAULTS.items():
            value = kwargs.pop(key, default)
            if value != default:
                raise ValueError(
                    f"This SentencePieceTokenizer was saved with {key} set; "
                    "keras_transformer's translators never set it. "
                    f"Received: {key}={value!r}"
                )
        kwargs.pop("dtype", None)  # keras-hub's int32 policy: no weights here
        super().__init__(**kwargs)
        if proto is not None:
            self._set_files({ASSET: bytes(proto)})

    def _from_files(self, files):
        if ASSET not in files:
            return None
        text = SentencePiece(files[ASSET])
        text.check_reserved()
        return text

    def _asset_files(self):
        return {ASSET: self._text().proto}

    def get_config(self):
        # The model travels as the asset, not in the config.
        return super().get_config()

    @property
    def proto(self):
        """The SentencePiece model's bytes (None before its asset is read)."""
        return None if self.text is None else self.text.proto


# The registered names of old files that this class reads.
OLD_NAMES = {"keras_hub>SentencePieceTokenizer": SentencePieceTokenizer}
