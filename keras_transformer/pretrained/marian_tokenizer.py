"""Marian's tokenizer: two SentencePiece models and a vocabulary file.

A Marian checkpoint spells its sources with ``source.spm`` and its
translations with ``target.spm``; the model's ids are neither model's own
but ``vocab.json``'s (piece -> id; ``target_vocab.json`` for the target when
the vocabularies are separate). Pieces missing from the vocabulary read as
``<unk>``. This tokenizer does that, then maps Marian's ids onto this
package's order (``marian.vocabulary_order``: pad, start, end, unk first),
so that the translators' ``encode`` and ``decode`` (which add the end id and
cut at it) work as for any tokenizer. It is a Keras layer whose files are
saved as assets, so a translator that holds it saves to and loads from a
``.keras`` file like any other.
"""

import json
import os

import keras
import numpy as np

from keras_transformer.pretrained.marian import vocabulary_order
from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID, UNK_ID

SOURCE_MODEL, TARGET_MODEL = "source.spm", "target.spm"
VOCABULARY, TARGET_VOCABULARY = "vocab.json", "target_vocab.json"
UNKNOWN = "<unk>"
# This package's reserved ids by the pieces its own tokenizers give them.
RESERVED = {"<pad>": PAD_ID, "<s>": START_ID, "</s>": END_ID, UNKNOWN: UNK_ID}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MarianTokenizer(keras.layers.Layer):
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

    The interface the translators use: ``tokenize(texts)`` (id lists, no end
    id), ``detokenize(id lists)`` (texts), ``vocabulary_size()`` (the source
    side's ids) and ``proto`` (``source.spm``'s bytes, which spell a source
    in as many pieces as it has ids).
    """

    def __init__(self, special, sizes, folder=None, **kwargs):
        kwargs["trainable"] = False  # no weights: files
        super().__init__(**kwargs)
        self.special = {
            name: int(special[name]) for name in ("pad", "start", "end", "unk")
        }
        self.sizes = tuple(int(size) for size in sizes)
        self.proto = None
        self._files = {}
        if folder is not None:
            self._read(folder)
        self.built = True

    # -- files -----------------------------------------------------------------

    def _read(self, folder):
        names = [SOURCE_MODEL, TARGET_MODEL, VOCABULARY]
        if os.path.isfile(os.path.join(folder, TARGET_VOCABULARY)):
            names.append(TARGET_VOCABULARY)
        files = {}
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{path}: no {name}; a Marian tokenizer needs it"
                )
            with open(path, "rb") as file:
                files[name] = file.read()
        self._set_files(files)

    def _set_files(self, files):
        import sentencepiece as spm

        self._files = dict(files)
        source = json.loads(files[VOCABULARY])
        target = json.loads(files.get(TARGET_VOCABULARY, files[VOCABULARY]))
        if UNKNOWN not in source or UNKNOWN not in target:
            raise ValueError(f"{VOCABULARY} has no {UNKNOWN} piece")
        self._source_vocabulary = source
        for name, vocabulary, size in (
            ("source", source, self.sizes[0]),
            ("target", target, self.sizes[1]),
        ):
            if max(vocabulary.values()) >= size:
                raise ValueError(
                    f"the {name} vocabulary has ids up to {max(vocabulary.values())}, "
                    f"the model {size} ids"
                )
        self.source_ids = vocabulary_order(self.sizes[0], **self.special)
        self.target_ids = vocabulary_order(self.sizes[1], **self.special)
        # Marian id -> this package's (pad before start for the shared row).
        self._ours = _inverse(self.source_ids)
        self._target_vocabulary = target
        self._ours_target = _inverse(self.target_ids)
        self._target_pieces = {int(i): piece for piece, i in target.items()}
        self._source = spm.SentencePieceProcessor(model_proto=files[SOURCE_MODEL])
        self._target = spm.SentencePieceProcessor(model_proto=files[TARGET_MODEL])
        self.proto = files[SOURCE_MODEL]

    def save_assets(self, dir_path):
        for name, data in self._files.items():
            with open(os.path.join(dir_path, name), "wb") as file:
                file.write(data)

    def load_assets(self, dir_path):
        self._read(dir_path)

    def get_config(self):
        config = super().get_config()
        config.update(special=self.special, sizes=list(self.sizes))
        return config

    # -- the translators' interface --------------------------------------------

    def tokenize(self, texts):
        """This package's source ids of each text, without the end id."""
        rows = []
        for text in texts:
            # A leading target-language token (">>fra<<") is one piece of the
            # vocabulary, not spelt by SentencePiece (as Marian reads it).
            code = []
            if text.startswith(">>") and (end := text.find("<<")) != -1:
                code, text = [text[: end + 2]], text[end + 2 :]
            pieces = code + self._source.encode(text, out_type=str)
            rows.append(_our_ids(pieces, self._source_vocabulary, self._ours))
        return rows

    def tokenize_targets(self, texts):
        """This package's target ids of each text (``target.spm`` and the
        target vocabulary), without the end id: a fine-tuning corpus's
        translations."""
        return [
            _our_ids(
                self._target.encode(text, out_type=str),
                self._target_vocabulary,
                self._ours_target,
            )
            for text in texts
        ]

    def detokenize(self, rows):
        """Texts from rows of this package's target ids (special ids left out
        by the caller), through ``target.spm``."""
        texts = []
        for row in rows:
            pieces = [
                self._target_pieces.get(int(self.target_ids[int(i)]), UNKNOWN)
                for i in row
            ]
            texts.append(self._target.decode_pieces(pieces))
        return texts

    def vocabulary_size(self):
        return len(self.source_ids)

    @property
    def target_languages(self):
        """The codes of the vocabulary's target-language tokens (``fra`` for
        ``>>fra<<``), which a model trained on several target languages
        reads first in a source; ``()`` for a model of one."""
        return tuple(
            sorted(
                piece[2:-2]
                for piece in self._source_vocabulary
                if piece.startswith(">>") and piece.endswith("<<") and len(piece) > 4
            )
        )

    def id_to_token(self, i):
        """The piece of one of this package's target ids (the reserved ids'
        pieces are this package's: ``<pad>``, ``<s>``, ``</s>``, ``<unk>``)."""
        for piece, reserved in RESERVED.items():
            if int(i) == reserved:
                return piece
        return self._target_pieces.get(int(self.target_ids[int(i)]), UNKNOWN)

    def token_to_id(self, piece):
        """This package's target id of a piece (``<unk>``'s if it has none)."""
        if piece in RESERVED:
            return RESERVED[piece]
        marian = self._target_vocabulary.get(piece)
        return UNK_ID if marian is None else int(self._ours_target[marian])


def _our_ids(pieces, vocabulary, ours):
    """Pieces to Marian's ids through ``vocabulary`` (``<unk>``'s for a piece
    it lacks), then to this package's through ``ours``."""
    unknown = vocabulary[UNKNOWN]
    return [int(ours[vocabulary.get(piece, unknown)]) for piece in pieces]


def _inverse(order):
    inverse = np.full(int(order.max()) + 1, -1, dtype="int64")
    for ours in range(len(order) - 1, -1, -1):
        inverse[order[ours]] = ours
    return inverse
