"""A joint subword vocabulary for source and target text (SentencePiece).

The paper (§5.1) uses one shared source-target vocabulary of byte-pair
encodings for English-German, which is what lets ``build_model`` tie the
embeddings (``share_embeddings=True``). Here the vocabulary is trained with the
``sentencepiece`` trainer (unigram or BPE) and wrapped in
``keras_hub.tokenizers.SentencePieceTokenizer``.

The four reserved ids (``keras_transformer.special_tokens``) are pieces 0
to 3 of every vocabulary: ``<pad>``, ``<s>``, ``</s>``, ``<unk>``.

``keras_hub`` and ``sentencepiece`` are imported inside the functions, so that
``import keras_transformer`` stays light.
"""

import io
import numbers
import os

from keras_transformer.special_tokens import END_ID, PAD_ID, START_ID, UNK_ID

_SPECIAL_PIECES = {
    "pad": (PAD_ID, "<pad>"),
    "bos": (START_ID, "<s>"),
    "eos": (END_ID, "</s>"),
    "unk": (UNK_ID, "<unk>"),
}


def train_tokenizer(
    texts,
    vocab_size,
    model_type="unigram",
    character_coverage=1.0,
    seed=0,
    normalization="nmt_nfkc",
    num_threads=1,
    user_defined_symbols=(),
):
    """Train a SentencePiece model in memory and return it serialised.

    For a joint vocabulary pass the source and the target sentences together,
    e.g. ``train_tokenizer(sources + targets, 8000)``.

    Args:
        texts: iterable of str, one sentence each. Read once, in order.
        vocab_size: int, the number of pieces wanted, the four reserved ids
            included. It is an upper bound: ``hard_vocab_limit=False`` lets
            the trainer stop below it on a corpus too small to fill it (the
            unigram trainer does; BPE reaches it whenever the corpus has
            enough distinct merges). It must cover every character kept
            (``character_coverage``) plus the four reserved pieces, or the
            trainer raises.
        model_type: ``"unigram"`` (SentencePiece's default) or ``"bpe"`` (the
            paper's byte-pair encoding).
        character_coverage: share of characters the vocabulary must cover;
            the rest become ``<unk>``. 1.0 suits small alphabets; SentencePiece
            recommends 0.9995 for languages with large character sets.
        seed: seed of SentencePiece's random generator (a process-wide
            setting, used when the trainer samples).
        normalization: SentencePiece normalisation rule: ``"nmt_nfkc"``
            (NFKC plus whitespace clean-up, SentencePiece's default) or
            ``"identity"`` (text kept as is; a proto about 240 kB smaller,
            since it carries no normalisation table).
        num_threads: trainer threads. Unigram training gives (slightly)
            different vocabularies with different thread counts, so the
            default of 1 keeps results the same on every machine.
        user_defined_symbols: strings kept as one piece each wherever they
            occur (SentencePiece's option), e.g. rare words that would be
            spelt letter by letter. They count towards ``vocab_size``.

    Returns:
        bytes: the serialised ``ModelProto``, ready for ``make_tokenizer``.

    Raises:
        TypeError: ``vocab_size`` is not an int, or ``texts`` is one string.
        ValueError: bad ``vocab_size``, ``model_type`` or coverage, or no text.
        RuntimeError: from SentencePiece, e.g. a vocabulary too small for the
            characters to cover.
    """
    import sentencepiece as spm

    texts = _checked_training_arguments(
        texts, vocab_size, model_type, character_coverage
    )
    symbols = _checked_symbols(user_defined_symbols)

    special = {}
    for kind, (piece_id, piece) in _SPECIAL_PIECES.items():
        special[f"{kind}_id"] = piece_id
        special[f"{kind}_piece"] = piece
    spm.set_random_generator_seed(int(seed))
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=int(vocab_size),
        model_type=model_type,
        character_coverage=float(character_coverage),
        normalization_rule_name=normalization,
        # Tiny corpora cannot always fill the vocabulary; stop short instead
        # of failing.
        hard_vocab_limit=False,
        num_threads=int(num_threads),
        user_defined_symbols=symbols,
        minloglevel=2,  # the trainer logs every step to stderr otherwise
        **special,
    )
    return model.getvalue()


def _checked_symbols(user_defined_symbols):
    """``user_defined_symbols`` as a list of str, after its checks."""
    if isinstance(user_defined_symbols, (str, bytes)):
        raise TypeError(
            "user_defined_symbols must be a list of strings, not one string. "
            f"Received: {user_defined_symbols!r}"
        )
    symbols = [str(symbol) for symbol in user_defined_symbols]
    if not all(symbols) or any(" " in s or "\t" in s for s in symbols):
        raise ValueError(
            "user_defined_symbols must be non-empty strings without spaces. "
            f"Received: {user_defined_symbols!r}"
        )
    return symbols


def _checked_training_arguments(texts, vocab_size, model_type, character_coverage):
    """``texts`` as a list of str, after the arguments' checks."""
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be an iterable of sentences, not one string.")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral):
        raise TypeError(f"vocab_size must be an int. Received: {vocab_size!r}")
    if vocab_size <= len(_SPECIAL_PIECES):
        raise ValueError(
            f"vocab_size must exceed the {len(_SPECIAL_PIECES)} reserved ids. "
            f"Received: vocab_size={vocab_size}"
        )
    if model_type not in ("unigram", "bpe"):
        raise ValueError(
            f"model_type must be 'unigram' or 'bpe'. Received: {model_type!r}"
        )
    if not 0.0 < character_coverage <= 1.0:
        raise ValueError(
            "character_coverage must be in (0, 1]. "
            f"Received: character_coverage={character_coverage!r}"
        )
    texts = [str(text) for text in texts]
    if not any(texts):
        raise ValueError("texts holds no non-empty sentence to train on.")
    return texts


def make_tokenizer(proto):
    """Wrap a trained model in ``keras_hub.tokenizers.SentencePieceTokenizer``.

    Outside ``tf.data`` and ``tf.function`` the tokenizer runs SentencePiece in
    Python on every backend (TensorFlow included) and returns Python lists.

    Args:
        proto: bytes from ``train_tokenizer``, or the path of a ``.model``
            file holding them.

    Returns:
        A built ``SentencePieceTokenizer``. Saved inside a ``.keras`` file it
        keeps its vocabulary as an asset (``vocabulary.spm``): its config
        alone (``keras.saving.serialize_keras_object``) has ``proto=None``.
    """
    import keras_hub

    if isinstance(proto, (str, os.PathLike)):
        # Read the file here: keras-hub 0.32 opens it without closing it,
        # which is a ResourceWarning (an error under pytest's settings).
        with open(proto, "rb") as file:
            proto = file.read()
    tokenizer = keras_hub.tokenizers.SentencePieceTokenizer(proto=proto)
    # The layer has no weights; marking it built lets it be saved on its own
    # without Keras' "model has not yet been built" warning.
    tokenizer.build(None)
    _check_reserved_ids(tokenizer)
    return tokenizer


def _check_reserved_ids(tokenizer):
    for piece_id, piece in _SPECIAL_PIECES.values():
        if tokenizer.id_to_token(piece_id) != piece:
            raise ValueError(
                f"The tokenizer's id {piece_id} is {tokenizer.id_to_token(piece_id)!r}"
                f", expected {piece!r}: train it with train_tokenizer, which "
                "reserves 0 <pad>, 1 <s>, 2 </s>, 3 <unk>."
            )


def special_ids(tokenizer):
    """The tokenizer's reserved ids, as the searches take them:
    ``{"start_id": ..., "end_id": ..., "pad_id": ...}``."""
    return {
        "start_id": tokenizer.token_to_id(_SPECIAL_PIECES["bos"][1]),
        "end_id": tokenizer.token_to_id(_SPECIAL_PIECES["eos"][1]),
        "pad_id": tokenizer.token_to_id(_SPECIAL_PIECES["pad"][1]),
    }


def encode(
    tokenizer, texts, add_start=False, add_end=True, start_id=START_ID, end_id=END_ID
):
    """Token ids of each sentence, as Python ints.

    Args:
        tokenizer: from ``make_tokenizer`` (or any with ``tokenize``).
        texts: list (or other sequence) of str.
        add_start: prepend ``start_id``.
        add_end: append ``end_id`` (so ``""`` gives ``[end_id]``).
        start_id, end_id: the tokenizer's, if not the reserved 1 and 2.

    Returns:
        list of lists of int, one per sentence; no padding.
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a list of sentences, not one string.")
    texts = list(texts)
    if not texts:
        return []
    pieces = tokenizer.tokenize(texts)
    if hasattr(pieces, "to_list"):  # a tf.RaggedTensor on the TF graph path
        pieces = pieces.to_list()
    prefix = [start_id] if add_start else []
    suffix = [end_id] if add_end else []
    return [prefix + [int(i) for i in ids] + suffix for ids in pieces]


def decode(tokenizer, ids, end_id=END_ID, pad_id=PAD_ID, start_id=START_ID):
    """Sentences from rows of ids, e.g. a model's (padded) greedy output.

    Each row is cut at its first ``end_id``; padding and ``start_id`` are
    dropped. Unknown ids decode to SentencePiece's `` ⁇ ``.

    Args:
        tokenizer: from ``make_tokenizer`` (or any with ``detokenize``).
        ids: list of lists of int, or a 2-D array or tensor.
        end_id, pad_id, start_id: the tokenizer's, if not the reserved ones.

    Returns:
        list of str, one per row.
    """
    if hasattr(ids, "tolist"):  # NumPy array
        rows = ids.tolist()
    elif hasattr(ids, "numpy"):  # backend tensor
        rows = ids.numpy().tolist()
    else:
        rows = [list(row) for row in ids]
    kept = []
    for row in rows:
        row = [int(i) for i in row]
        if end_id in row:
            row = row[: row.index(end_id)]
        kept.append([i for i in row if i not in (pad_id, start_id)])
    if not kept:
        # keras-hub reads an empty batch as one empty sentence.
        return []
    texts = tokenizer.detokenize(kept)
    if hasattr(texts, "numpy"):  # a tf.Tensor of bytes on the TF graph path
        texts = texts.numpy().tolist()
    return [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in texts]


class SentencePiece:
    """A tokenizer from a SentencePiece model's bytes with the
    ``sentencepiece`` package alone: the calls of keras-hub's
    ``SentencePieceTokenizer`` that the translators make, for engines that
    run without TensorFlow (keras-hub's tokenizer brings it in).

    Args:
        proto: the model's bytes (``tokenizer.proto``).
    """

    def __init__(self, proto):
        import sentencepiece as spm

        self.proto = proto
        # As keras-hub builds it for Python (no bos, no eos, no sampling).
        self._processor = spm.SentencePieceProcessor(model_proto=proto, out_type=int)

    def tokenize(self, texts):
        return self._processor.Encode(list(texts))

    def detokenize(self, ids):
        return self._processor.Decode([list(row) for row in ids])

    def vocabulary_size(self):
        return self._processor.get_piece_size()

    def id_to_token(self, i):
        return self._processor.id_to_piece(int(i))

    def token_to_id(self, piece):
        return self._processor.piece_to_id(piece)
