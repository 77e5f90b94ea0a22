"""A joint subword vocabulary for source and target text (SentencePiece).

The paper (§5.1) uses one shared source-target vocabulary of byte-pair
encodings for English-German, which is what lets ``build_model`` tie the
embeddings (``share_embeddings=True``). Here the vocabulary is trained with the
``sentencepiece`` trainer (unigram or BPE) and wrapped in the package's
``SentencePieceTokenizer`` layer (``data.sentencepiece_layer``), which answers
the tokenizer contract (``data.contract``).

The four reserved ids (``keras_transformer.special_tokens``) are pieces 0
to 3 of every vocabulary: ``<pad>``, ``<s>``, ``</s>``, ``<unk>``.

``sentencepiece`` and Keras are imported inside the functions, so that reading
this module costs neither.
"""

import io
import numbers
import os

from keras_transformer.special_tokens import END_ID, PAD_ID, PIECES, START_ID, UNK_ID

__all__ = [
    "END_ID",
    "PAD_ID",
    "START_ID",
    "UNK_ID",
    "decode",
    "encode",
    "make_tokenizer",
    "special_ids",
    "train_tokenizer",
]

# SentencePiece's trainer names the reserved ids by these kinds.
_SPECIAL_PIECES = {
    kind: (piece_id, PIECES[piece_id])
    for kind, piece_id in (
        ("pad", PAD_ID),
        ("bos", START_ID),
        ("eos", END_ID),
        ("unk", UNK_ID),
    )
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
    """The package's tokenizer layer (``SentencePieceTokenizer``) for a
    trained model.

    It runs SentencePiece in Python (the ``sentencepiece`` package) on every
    backend and returns Python lists; it needs neither TensorFlow nor
    keras-hub.

    Args:
        proto: bytes from ``train_tokenizer``, or the path of a ``.model``
            file holding them.

    Returns:
        A ``SentencePieceTokenizer`` (a Keras layer answering the
        ``TextTokenizer`` contract). Saved inside a ``.keras`` file it keeps
        its model as an asset (``vocabulary.spm``).

    Raises:
        ValueError: the model does not reserve 0 ``<pad>``, 1 ``<s>``,
            2 ``</s>``, 3 ``<unk>``.
    """
    from keras_transformer.data.sentencepiece_layer import SentencePieceTokenizer

    if isinstance(proto, (str, os.PathLike)):
        with open(proto, "rb") as file:
            proto = file.read()
    return SentencePieceTokenizer(proto=proto)


def special_ids(tokenizer):
    """The tokenizer's reserved ids, as the searches take them:
    ``{"start_id": ..., "end_id": ..., "pad_id": ...}``."""
    return {
        "start_id": tokenizer.start_id,
        "end_id": tokenizer.end_id,
        "pad_id": tokenizer.pad_id,
    }


def encode(tokenizer, texts, add_start=False, add_end=True):
    """Token ids of each sentence, as Python ints.

    Args:
        tokenizer: a ``TextTokenizer`` (``make_tokenizer``'s, or an imported
            checkpoint's).
        texts: list (or other sequence) of str.
        add_start: prepend the start id.
        add_end: append the end id (so ``""`` gives ``[end_id]``).

    Returns:
        list of lists of int, one per sentence; no padding.
    """
    prefix = [tokenizer.start_id] if add_start else []
    return [prefix + row for row in tokenizer.encode(texts, add_end=add_end)]


def decode(tokenizer, ids):
    """Sentences from rows of ids, e.g. a model's (padded) greedy output:
    each row cut at its first end id, padding and start ids dropped
    (``tokenizer.decode``). Unknown ids decode to SentencePiece's `` ⁇ ``.

    Args:
        tokenizer: a ``TextTokenizer``.
        ids: list of lists of int, or a 2-D array or tensor.

    Returns:
        list of str, one per row.
    """
    return tokenizer.decode(ids)
