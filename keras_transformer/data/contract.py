"""What a translator's tokenizer is: one contract, written once.

Text enters the model as ids and leaves it as ids; a tokenizer is what maps
one onto the other, in the **model's** id order. Every consumer (the
translators, the trainer's inputs, the exports, the server) asks this
contract and nothing else: none reads a SentencePiece file to guess the
model's order, since a checkpoint imported from elsewhere (Marian's
``vocab.json``) numbers its pieces in an order of its own.

An implementation supplies six things:

- ``tokenize(texts)``: each source text's ids, without the end id (a
  leading target-language token such as ``>>fra<<`` is one id where the
  model has several target languages);
- ``tokenize_targets(texts)``: the same for target text (a training
  corpus's translations), which may be spelt by a model of its own;
- ``detokenize(rows)``: texts from rows of target ids, special ids already
  left out;
- ``source_pieces()``, ``target_pieces()``: the pieces in model-id order,
  what an exporter writes as the vocabulary;
- ``export_files()``: the files the tokenizer is rebuilt from, by name;
  ``export_settings()``: whatever else it needs (JSON values); ``kind``: its
  name for ``from_export`` of the engines that rebuild it.

The rest is written here once: the special ids (the package's reserved
0-3: ``keras_transformer.special_tokens``), ``encode`` (ids and the end
id), ``decode`` (cut at the end id, padding and start ids dropped),
``count`` (source lengths without a second processor), ``vocabulary_size``
and the piece look-ups.

This module imports neither Keras nor a backend.
"""

from keras_transformer.special_tokens import END_ID, PAD_ID, PIECES, START_ID, UNK_ID


class TextTokenizer:
    """The contract (module docstring). Subclasses supply ``tokenize``,
    ``detokenize``, ``source_pieces``, ``target_pieces``, ``export_files``,
    ``export_settings`` and ``kind``; ``tokenize_targets`` defaults to
    ``tokenize`` (one model spells both sides); ``target_languages`` to
    none; ``has_vocabulary`` to True."""

    kind = None
    pad_id = PAD_ID
    start_id = START_ID
    end_id = END_ID
    unk_id = UNK_ID

    # -- what an implementation supplies ------------------------------------------

    def tokenize(self, texts):
        raise NotImplementedError(f"{type(self).__name__} must define tokenize")

    def tokenize_targets(self, texts):
        return self.tokenize(texts)

    def detokenize(self, rows):
        raise NotImplementedError(f"{type(self).__name__} must define detokenize")

    def source_pieces(self):
        raise NotImplementedError(f"{type(self).__name__} must define source_pieces")

    def target_pieces(self):
        raise NotImplementedError(f"{type(self).__name__} must define target_pieces")

    def export_files(self):
        raise NotImplementedError(f"{type(self).__name__} must define export_files")

    def export_settings(self):
        return {}

    @property
    def has_vocabulary(self):
        """False for a tokenizer loaded from a ``.keras`` file whose files
        were missing: it cannot spell anything yet."""
        return True

    @property
    def target_languages(self):
        """The codes of the vocabulary's target-language tokens (``fra``
        for ``>>fra<<``), sorted; ``()`` for a model of one target
        language."""
        return ()

    # -- written once ----------------------------------------------------------------

    def special_ids(self):
        """``{"pad", "start", "end", "unk"}``: the reserved ids."""
        return {
            "pad": self.pad_id,
            "start": self.start_id,
            "end": self.end_id,
            "unk": self.unk_id,
        }

    def encode(self, texts, add_end=True):
        """Each source text's ids, ending with the end id (``""`` gives
        ``[end_id]``); no padding, no cut."""
        texts = _texts(texts)
        if not texts:
            return []
        suffix = [self.end_id] if add_end else []
        return [[int(i) for i in row] + suffix for row in self.tokenize(texts)]

    def encode_targets(self, texts):
        """Each target text's ids, without the end id (a corpus's
        translations: the trainer adds the start and end ids)."""
        texts = _texts(texts)
        if not texts:
            return []
        return [[int(i) for i in row] for row in self.tokenize_targets(texts)]

    def count(self, texts):
        """Each source text's length in ids, end id included."""
        return [len(row) for row in self.encode(texts)]

    def decode(self, rows):
        """Texts from rows of generated ids (lists, or a 2-D array): each cut
        at its first end id, padding and start ids dropped."""
        if not hasattr(rows, "tolist") and hasattr(rows, "numpy"):
            rows = rows.numpy()  # a backend tensor
        if hasattr(rows, "tolist"):
            rows = rows.tolist()
        kept = []
        for row in rows:
            row = [int(i) for i in row]
            if self.end_id in row:
                row = row[: row.index(self.end_id)]
            kept.append([i for i in row if i not in (self.pad_id, self.start_id)])
        if not kept:
            return []
        return [str(text) for text in self.detokenize(kept)]

    def vocabulary_size(self):
        """How many source ids the tokenizer gives."""
        return len(self.source_pieces())

    def id_to_token(self, i):
        """The piece of a target id."""
        return self.target_pieces()[int(i)]

    def token_to_id(self, piece):
        """The target id of a piece (the unknown id if it has none)."""
        pieces = self.target_pieces()
        return pieces.index(piece) if piece in pieces else self.unk_id

    def check_reserved(self):
        """``ValueError`` unless the reserved ids are the pieces ``<pad>``,
        ``<s>``, ``</s>``, ``<unk>`` on both sides."""
        expected = {i: PIECES[i] for i in self.special_ids().values()}
        for side, pieces in (
            ("source", self.source_pieces()),
            ("target", self.target_pieces()),
        ):
            found = {i: pieces[i] if i < len(pieces) else None for i in expected}
            if found != expected:
                raise ValueError(
                    f"The tokenizer's {side} ids 0-3 are {list(found.values())}, "
                    f"not the reserved {list(expected.values())}: train it with "
                    "train_tokenizer, which reserves 0 <pad>, 1 <s>, 2 </s>, "
                    "3 <unk>."
                )


def _texts(texts):
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a list of sentences, not one string.")
    return list(texts)
