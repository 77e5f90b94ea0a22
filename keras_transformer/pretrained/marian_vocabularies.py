"""Marian's tokenizer in plain Python: two SentencePiece models and a
vocabulary file.

A Marian checkpoint spells its sources with ``source.spm`` and its
translations with ``target.spm``; the model's ids are neither model's own
but ``vocab.json``'s (piece -> id; ``target_vocab.json`` for the target when
the vocabularies are separate). Pieces missing from the vocabulary read as
``<unk>``. ``MarianVocabularies`` does that, then maps Marian's ids onto
this package's order (``marian.vocabulary_order``: pad, start, end, unk
first), so that it answers the tokenizer contract (``data.contract``) as
any tokenizer of the package does. The Keras layer a ``.keras`` translator
holds (``marian_tokenizer.MarianTokenizer``) and the CTranslate2 engine run
this class; it imports neither Keras nor a backend.
"""

import json

import numpy as np

from keras_transformer.data.contract import TextTokenizer
from keras_transformer.pretrained.marian import vocabulary_order
from keras_transformer.special_tokens import PIECES

SOURCE_MODEL, TARGET_MODEL = "source.spm", "target.spm"
VOCABULARY, TARGET_VOCABULARY = "vocab.json", "target_vocab.json"
FILES = (SOURCE_MODEL, TARGET_MODEL, VOCABULARY, TARGET_VOCABULARY)
UNKNOWN = "<unk>"


class MarianVocabularies(TextTokenizer):
    """A ``TextTokenizer`` from a Marian checkpoint's files.

    Args:
        files: name -> bytes: ``source.spm``, ``target.spm``, ``vocab.json``
            and, for separate vocabularies, ``target_vocab.json``.
        special: Marian's ids ``{"pad", "start", "end", "unk"}``.
        sizes: the model's source and target vocabulary sizes in Marian's
            ids, which the order of the ids depends on.
    """

    kind = "marian"

    def __init__(self, files, special, sizes):
        import sentencepiece as spm

        for name in (SOURCE_MODEL, TARGET_MODEL, VOCABULARY):
            if name not in files:
                raise FileNotFoundError(f"no {name}; a Marian tokenizer needs it")
        self.files = {name: bytes(files[name]) for name in FILES if name in files}
        self.special = {
            name: int(special[name]) for name in ("pad", "start", "end", "unk")
        }
        self.sizes = tuple(int(size) for size in sizes)
        source = json.loads(files[VOCABULARY])
        target = json.loads(files.get(TARGET_VOCABULARY, files[VOCABULARY]))
        if UNKNOWN not in source or UNKNOWN not in target:
            raise ValueError(f"{VOCABULARY} has no {UNKNOWN} piece")
        for name, vocabulary, size in (
            ("source", source, self.sizes[0]),
            ("target", target, self.sizes[1]),
        ):
            if max(vocabulary.values()) >= size:
                raise ValueError(
                    f"the {name} vocabulary has ids up to {max(vocabulary.values())}, "
                    f"the model {size} ids"
                )
        self._source_vocabulary, self._target_vocabulary = source, target
        self.source_ids = vocabulary_order(self.sizes[0], **self.special)
        self.target_ids = vocabulary_order(self.sizes[1], **self.special)
        # Marian id -> this package's (pad before start for the shared row).
        self._ours = _inverse(self.source_ids)
        self._ours_target = _inverse(self.target_ids)
        self._source_pieces = _pieces(source, self.source_ids)
        self._target_pieces = _pieces(target, self.target_ids)
        self._target_piece_ids = {}
        for i, piece in enumerate(self._target_pieces):
            self._target_piece_ids.setdefault(piece, i)
        self._source = spm.SentencePieceProcessor(model_proto=files[SOURCE_MODEL])
        self._target = spm.SentencePieceProcessor(model_proto=files[TARGET_MODEL])

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
        target vocabulary), without the end id."""
        return [
            _our_ids(
                self._target.encode(text, out_type=str),
                self._target_vocabulary,
                self._ours_target,
            )
            for text in texts
        ]

    def detokenize(self, rows):
        """Texts from rows of this package's target ids, through
        ``target.spm``."""
        return [
            self._target.decode_pieces([self._target_pieces[int(i)] for i in row])
            for row in rows
        ]

    def source_pieces(self):
        return list(self._source_pieces)

    def target_pieces(self):
        return list(self._target_pieces)

    def token_to_id(self, piece):
        return self._target_piece_ids.get(piece, self.unk_id)

    @property
    def target_languages(self):
        return tuple(
            sorted(
                piece[2:-2]
                for piece in self._source_vocabulary
                if piece.startswith(">>") and piece.endswith("<<") and len(piece) > 4
            )
        )

    def export_files(self):
        return dict(self.files)

    def export_settings(self):
        return {"special": dict(self.special), "sizes": list(self.sizes)}

    @classmethod
    def from_export(cls, files, settings):
        return cls(files, settings["special"], settings["sizes"])


def _pieces(vocabulary, order):
    """Each of this package's ids' piece: the reserved ids' own names
    (``<pad>``, ``<s>``, ``</s>``, ``<unk>``), then Marian's piece of the
    Marian id it maps to (``<unk>`` for an id the vocabulary does not
    name)."""
    names = {int(i): piece for piece, i in vocabulary.items()}
    pieces = [names.get(int(marian), UNKNOWN) for marian in order]
    for i, piece in PIECES.items():
        pieces[i] = piece
    return pieces


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
