"""The joint SentencePiece tokenizer: reserved ids, round trips, saving."""

import os

import keras
import numpy as np
import pytest

from keras_transformer.data import tokenizer as tk
from keras_transformer.data.numbers import english, german

# A small joint corpus: English and German number words.
NUMBERS = list(range(0, 1000, 7)) + list(range(1000, 1_000_000, 9973))
TEXTS = [english(n) for n in NUMBERS] + [german(n) for n in NUMBERS]
VOCAB_SIZE = 100


@pytest.fixture(scope="module")
def proto():
    return tk.train_tokenizer(TEXTS, VOCAB_SIZE)


@pytest.fixture
def tokenizer(proto):
    return tk.make_tokenizer(proto)


@pytest.mark.once
def test_reserved_ids(tokenizer):
    expected = {0: "<pad>", 1: "<s>", 2: "</s>", 3: "<unk>"}
    assert (tk.PAD_ID, tk.START_ID, tk.END_ID, tk.UNK_ID) == (0, 1, 2, 3)
    for piece_id, piece in expected.items():
        assert tokenizer.id_to_token(piece_id) == piece
        assert tokenizer.token_to_id(piece) == piece_id
    # No ordinary text is ever spelled with the control pieces.
    ids = tk.encode(tokenizer, TEXTS, add_end=False)
    assert min(min(row) for row in ids) > tk.UNK_ID


@pytest.mark.once
@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_round_trip_on_training_sentences(model_type):
    tokenizer = tk.make_tokenizer(tk.train_tokenizer(TEXTS, 80, model_type))
    ids = tk.encode(tokenizer, TEXTS)
    assert all(row[-1] == tk.END_ID and tk.END_ID not in row[:-1] for row in ids)
    # Python ints on every backend, not NumPy or backend scalars.
    assert {type(i) for row in ids for i in row} == {int}
    assert tk.decode(tokenizer, ids) == TEXTS


@pytest.mark.once
def test_encode_markers_and_empty_string(tokenizer):
    assert tk.encode(tokenizer, [""]) == [[tk.END_ID]]
    assert tk.encode(tokenizer, [""], add_start=True) == [[tk.START_ID, tk.END_ID]]
    assert tk.encode(tokenizer, [""], add_end=False) == [[]]
    plain = tk.encode(tokenizer, ["forty-two"], add_end=False)[0]
    both = tk.encode(tokenizer, ["forty-two"], add_start=True)[0]
    assert both == [tk.START_ID, *plain, tk.END_ID]
    assert tk.encode(tokenizer, []) == []
    with pytest.raises(TypeError):
        tk.encode(tokenizer, "forty-two")


@pytest.mark.once
def test_decode_stops_at_end_and_drops_padding(tokenizer):
    body = tk.encode(tokenizer, ["seven hundred", "elf"], add_end=False)
    other = tk.encode(tokenizer, ["nine"], add_end=False)[0]
    width = 4 + max(len(b) for b in body) + len(other)
    rows = []
    for ids in body:
        # What a greedy decoder emits: <s>, the sentence, </s>, then anything
        # (here more words), padded to a common width.
        row = [tk.START_ID, *ids, tk.END_ID, *other]
        rows.append(row + [tk.PAD_ID] * (width - len(row)))
    assert tk.decode(tokenizer, np.array(rows, dtype="int32")) == [
        "seven hundred",
        "elf",
    ]
    assert tk.decode(tokenizer, [[tk.PAD_ID, tk.END_ID]]) == [""]
    assert tk.decode(tokenizer, []) == []


@pytest.mark.once
def test_unseen_character_is_unknown(tokenizer):
    # "Ω" and "#" never occur in the corpus (lower-case letters, umlauts,
    # ß, space and hyphen only).
    ids = tk.encode(tokenizer, ["Ω", "one # two"])
    assert tk.UNK_ID in ids[0] and tk.UNK_ID in ids[1]
    assert ids[0][-1] == tk.END_ID
    known = tk.encode(tokenizer, ["one two"])[0]
    assert tk.UNK_ID not in known
    # The known words around the unknown one survive.
    text = tk.decode(tokenizer, [ids[1]])[0]
    assert text.startswith("one ") and text.endswith(" two")


@pytest.mark.once
def test_vocabulary_size():
    # Exactly the requested size when the corpus can fill it (both trainers).
    for model_type in ("unigram", "bpe"):
        proto = tk.train_tokenizer(TEXTS, VOCAB_SIZE, model_type)
        assert tk.make_tokenizer(proto).vocabulary_size() == VOCAB_SIZE
    # hard_vocab_limit=False: a request the corpus cannot fill stops short
    # instead of failing. Pieces do not cross spaces, so each is a substring
    # of one distinct word, with or without the leading "▁".
    words = {word for text in TEXTS for word in text.split()}
    bound = 4 + 2 * sum(len(w) * (len(w) + 1) // 2 for w in words)
    size = tk.make_tokenizer(tk.train_tokenizer(TEXTS, bound + 1000)).vocabulary_size()
    assert VOCAB_SIZE < size <= bound
    # Every character of the corpus needs a piece: 26 distinct characters
    # (a-z minus j, k, m, p, q; ö, ü, ß; "-" and the space as "▁") plus the
    # 4 reserved ids is the least vocabulary there can be.
    assert len(set("".join(TEXTS))) == 26
    assert tk.make_tokenizer(tk.train_tokenizer(TEXTS, 30)).vocabulary_size() == 30
    with pytest.raises(RuntimeError, match="smaller than required_chars"):
        tk.train_tokenizer(TEXTS, 29)


@pytest.mark.once
def test_training_is_deterministic(proto):
    assert tk.train_tokenizer(TEXTS, VOCAB_SIZE) == proto
    bpe = tk.train_tokenizer(TEXTS, VOCAB_SIZE, "bpe")
    assert tk.train_tokenizer(TEXTS, VOCAB_SIZE, "bpe") == bpe
    assert bpe != proto


@pytest.mark.once
def test_bad_arguments():
    with pytest.raises(TypeError):
        tk.train_tokenizer("one two", 50)
    with pytest.raises(ValueError, match="reserved"):
        tk.train_tokenizer(TEXTS, 4)
    with pytest.raises(ValueError, match="model_type"):
        tk.train_tokenizer(TEXTS, 50, model_type="wordpiece")
    with pytest.raises(ValueError, match="no non-empty"):
        tk.train_tokenizer(["", ""], 50)
    with pytest.raises(TypeError, match="not one string"):
        tk.train_tokenizer(TEXTS, 50, user_defined_symbols="null")
    for symbols in ([""], ["a b"]):
        with pytest.raises(ValueError, match="without spaces"):
            tk.train_tokenizer(TEXTS, 50, user_defined_symbols=symbols)


@pytest.mark.once
def test_user_defined_symbols_are_whole_pieces():
    """Rare words as one piece each: without them a small vocabulary spells
    "null" (once in the texts) letter by letter."""
    import sentencepiece as spm

    def pieces(proto, text):
        processor = spm.SentencePieceProcessor(model_proto=proto)
        return processor.encode(text, out_type=str)

    texts = TEXTS + ["zero", "null"]
    plain = tk.train_tokenizer(texts, VOCAB_SIZE)
    assert pieces(plain, "null") == ["▁", "n", "u", "l", "l"]
    whole = tk.train_tokenizer(texts, VOCAB_SIZE, user_defined_symbols=["zero", "null"])
    assert pieces(whole, "null") == ["▁", "null"]
    assert pieces(whole, "zero") == ["▁", "zero"]
    # Counted in the vocabulary, after the reserved ids; the round trip holds.
    tokenizer = tk.make_tokenizer(whole)
    assert tokenizer.vocabulary_size() <= VOCAB_SIZE
    assert tokenizer.token_to_id("null") > tk.UNK_ID
    ids = tk.encode(tokenizer, ["null", "zero", "einhundertnull"])
    assert tk.decode(tokenizer, ids) == ["null", "zero", "einhundertnull"]


@pytest.mark.once
def test_rejects_model_with_other_reserved_ids():
    import io

    import sentencepiece as spm

    # SentencePiece's own defaults: <unk> 0, <s> 1, </s> 2, no padding.
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS),
        model_writer=model,
        vocab_size=60,
        minloglevel=2,
        num_threads=1,
    )
    with pytest.raises(ValueError, match="not the reserved \\['<pad>'"):
        tk.make_tokenizer(model.getvalue())


def test_keras_file_round_trip(tokenizer, proto, tmp_path):
    path = os.path.join(tmp_path, "tokenizer.keras")
    keras.saving.save_model(tokenizer, path)
    loaded = keras.saving.load_model(path)
    assert loaded.proto == proto
    assert tk.encode(loaded, TEXTS) == tk.encode(tokenizer, TEXTS)
    # The config alone leaves the vocabulary to the asset, and names the
    # package's class, not keras-hub's.
    config = keras.saving.serialize_keras_object(tokenizer)
    assert "proto" not in config["config"]
    assert config["registered_name"] == "keras_transformer>SentencePieceTokenizer"


@pytest.mark.slow
def test_make_tokenizer_from_file(proto, tmp_path):
    path = tmp_path / "joint.model"
    path.write_bytes(proto)
    from_file = tk.make_tokenizer(path)
    assert tk.encode(from_file, TEXTS[:20]) == tk.encode(
        tk.make_tokenizer(proto), TEXTS[:20]
    )
