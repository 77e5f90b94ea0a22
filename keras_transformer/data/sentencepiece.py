"""The package's tokenizer on the ``sentencepiece`` package alone.

One SentencePiece model spells sources and targets (the paper's shared
vocabulary, §5.1), and its piece ids are the model's ids: piece ``i`` is
row ``i`` of the embeddings. The Keras layer that a ``.keras`` translator
saves (``sentencepiece_layer.SentencePieceTokenizer``) and the CTranslate2
engine both run this class; neither needs TensorFlow.
"""

from keras_transformer.data.contract import TextTokenizer

MODEL_FILE = "tokenizer.model"


class SentencePiece(TextTokenizer):
    """A ``TextTokenizer`` from a SentencePiece model's bytes.

    Args:
        proto: the serialised ``ModelProto`` (``train_tokenizer``'s bytes,
            or a ``.model`` file's).
    """

    kind = "sentencepiece"

    def __init__(self, proto):
        import sentencepiece as spm

        self.proto = bytes(proto)
        # No bos, no eos, no sampling: the contract adds the end id itself.
        self._processor = spm.SentencePieceProcessor(
            model_proto=self.proto, out_type=int
        )
        size = self._processor.get_piece_size()
        self._pieces = [self._processor.id_to_piece(i) for i in range(size)]

    def tokenize(self, texts):
        return self._processor.Encode(list(texts))

    def detokenize(self, rows):
        return self._processor.Decode([[int(i) for i in row] for row in rows])

    def source_pieces(self):
        return list(self._pieces)

    target_pieces = source_pieces

    def vocabulary_size(self):
        return len(self._pieces)

    def id_to_token(self, i):
        return self._pieces[int(i)]

    def token_to_id(self, piece):
        return self._processor.piece_to_id(piece)

    def export_files(self):
        return {MODEL_FILE: self.proto}

    @classmethod
    def from_export(cls, files, settings=None):
        """The tokenizer that ``export_files`` wrote (``files``: name ->
        bytes)."""
        return cls(files[MODEL_FILE])
