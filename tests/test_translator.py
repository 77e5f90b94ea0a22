"""Translator: tokenizer + Transformer + greedy decoding, saved as one file.

Per backend: the searches against a reference that runs the whole model
once per token, and the `.keras` round trip. Marked `once`: the Translator's own
Python (lengths, warnings, argument checks), the same on every backend.
"""

import io
import os
import types
import warnings
import zipfile

import h5py
import keras
import numpy as np
import pytest

from keras_transformer import build_model
from keras_transformer.data import tokenizer as tk
from keras_transformer.data.numbers import english, german
from keras_transformer.translate.keras_translator import Translator
from tests import numpy_reference

NUMBERS = list(range(0, 1000, 5))  # 200 numbers
SOURCES = [english(n) for n in NUMBERS]
SMALL = dict(num_layers=1, d_model=32, num_heads=4, d_ff=64)


@pytest.fixture(scope="module")
def proto():
    return tk.train_tokenizer(SOURCES + [german(n) for n in NUMBERS], 60)


@pytest.fixture
def tokenizer(proto):
    return tk.make_tokenizer(proto)


def tiny_model(tokenizer, **overrides):
    return build_model(
        "tiny", src_vocab_size=tokenizer.vocabulary_size(), **{**SMALL, **overrides}
    )


def pad(rows, width):
    array = np.zeros((len(rows), width), "int32")
    for i, row in enumerate(rows):
        array[i, : len(row)] = row
    return array


@pytest.fixture(scope="module")
def trained(proto):
    """A translator trained for a few seconds to copy English number words.

    Partly trained on purpose: some outputs end with END after a varying
    number of tokens, others loop until the length limit, so the greedy
    reference test sees both ways of stopping.
    """
    keras.utils.set_random_seed(0)
    tokenizer = tk.make_tokenizer(proto)
    model = tiny_model(tokenizer)
    src = tk.encode(tokenizer, SOURCES)
    body = tk.encode(tokenizer, SOURCES, add_end=False)
    width = max(len(row) for row in src) + 1
    x = {
        "encoder_inputs": pad(src, width),
        "decoder_inputs": pad([[tk.START_ID, *t] for t in body], width),
    }
    y = pad([[*t, tk.END_ID] for t in body], width)
    model.compile(
        keras.optimizers.Adam(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, batch_size=25, epochs=12, verbose=0)
    return Translator(tokenizer, model)


# The references below feed the decoder its prefix right-padded to this
# width, so that predict_on_batch compiles once per source length, not once
# per (source length, prefix length). Padding on the right cannot change the
# last real position: the decoder's causal mask (section 3.2.3) hides later
# positions from it, whatever they hold. The source row stays unpadded.
DECODER_WIDTH = 16


def next_logits(model, src_ids, prefix):
    """The model's logits after ``prefix`` (which starts with START)."""
    if len(prefix) > DECODER_WIDTH:
        raise ValueError(f"prefix of {len(prefix)} > DECODER_WIDTH")
    decoder = np.zeros((1, DECODER_WIDTH), "int32")
    decoder[0, : len(prefix)] = prefix
    # predict_on_batch: inference mode, compiled per shape (an eager call per
    # step is slow on JAX, each new shape recompiling every op).
    logits = model.predict_on_batch(
        {"encoder_inputs": np.array([src_ids], "int32"), "decoder_inputs": decoder}
    )
    return np.asarray(logits)[0, len(prefix) - 1]


def naive_greedy(model, src_ids, max_steps):
    """Greedy decoding written out: one row, the whole prefix each step.

    Starts from [START]; appends the argmax (over ids other than PAD and
    START, which a sentence never contains) of the last position's logits;
    stops after END or after max_steps tokens.
    """
    out = []
    dec = [tk.START_ID]
    while len(out) < max_steps:
        token = int(np.argmax(next_logits(model, src_ids, dec)[2:])) + 2
        out.append(token)
        if token == tk.END_ID:
            break
        dec.append(token)
    return out


@pytest.mark.slow
@pytest.mark.once
def test_untrained_model_returns_strings(tokenizer):
    translator = Translator(tokenizer, tiny_model(tokenizer))
    texts = ["one hundred", "seven", "twenty-three thousand four", "nine"]
    out = translator.translate(texts, max_output_length=6)
    assert isinstance(out, list) and len(out) == len(texts)
    assert all(isinstance(text, str) for text in out)
    ids = translator.translate_ids(texts, max_output_length=6)
    assert len(ids) == len(texts)
    for row in ids:
        assert 1 <= len(row) <= 6
        # Stops right after END, or at the limit; never PAD or START.
        assert tk.END_ID not in row[:-1]
        assert row[-1] == tk.END_ID or len(row) == 6
        assert tk.PAD_ID not in row and tk.START_ID not in row
    assert tk.decode(tokenizer, ids) == out
    # Calling the model gives the transformer's logits.
    inputs = {
        "encoder_inputs": np.array([[5, 6, 2]], "int32"),
        "decoder_inputs": np.array([[1, 7]], "int32"),
    }
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(translator(inputs)),
        keras.ops.convert_to_numpy(translator.transformer(inputs)),
    )
    with pytest.raises(TypeError):
        translator.translate("seven")
    assert translator.translate([]) == []


@pytest.mark.slow
@pytest.mark.once
def test_default_output_length_is_source_length_plus_50(tokenizer):
    # Paper §6.1: at most input length + 50 tokens, and never more than the
    # model's max_length.
    translator = Translator(tokenizer, tiny_model(tokenizer, max_length=64))
    texts = ["seven", "one hundred twenty-three thousand four hundred fifty-six"]
    src_lengths = [len(row) - 1 for row in tk.encode(tokenizer, texts)]
    assert src_lengths[0] + 50 < 64 < src_lengths[1] + 50
    ids = translator.translate_ids(texts)
    for row, limit in zip(ids, [src_lengths[0] + 50, 64], strict=True):
        assert row[-1] == tk.END_ID or len(row) == limit
        assert len(row) <= limit
    # An untrained model rarely stops: at least one row shows the limit.
    assert any(tk.END_ID not in row for row in ids)


def greedy_reference(trained):
    """Texts, their ids, greedy settings and the naive greedy tokens."""
    texts = [SOURCES[i] for i in (3, 0, 57, 199)] + [""]
    src = tk.encode(trained.tokenizer, texts)
    assert len({len(row) for row in src}) >= 4  # different source lengths
    # The limit cuts the longest output short, whether it would end with END
    # or loop on (which depends on how training went on this backend).
    # Greedy search with a limit gives the first `limit` tokens of a longer run.
    # An empty source (only the end id) is not searched: its translation is
    # empty on every engine (TranslatorBase.output_limit).
    free = [
        naive_greedy(trained.transformer, row, 11) if row[:-1] else [] for row in src
    ]
    limit = max(len(row) for row in free) - 1
    expected = [row[:limit] for row in free]
    # The reference is not trivial: rows stop at END after different numbers
    # of tokens, and some reach the limit.
    ended = [row for row in expected if row and row[-1] == tk.END_ID]
    assert len({len(row) for row in ended}) >= 2
    assert any(len(row) == limit for row in expected)
    return texts, src, dict(beam_size=1, max_output_length=limit), expected


@pytest.mark.slow
def test_greedy_matches_naive_reference(trained):
    texts, src, greedy, expected = greedy_reference(trained)
    # One padded batch and the raw-id entry point agree with the unpadded
    # reference.
    assert trained.translate_ids(texts, **greedy) == expected
    assert [row[0][0] for row in trained.decode_ids(src, **greedy)] == expected
    assert trained.translate(texts, **greedy) == tk.decode(trained.tokenizer, expected)


# Splitting into batches is the Translator's own NumPy, and the uncached
# search is checked against the cached one on every backend in
# test_decoding.py; each compiles a search of its own (slow on TensorFlow).
@pytest.mark.slow
@pytest.mark.once
def test_greedy_in_batches_and_uncached_matches_naive_reference(trained):
    texts, _, greedy, expected = greedy_reference(trained)
    # Several batches, a partial one with padding rows.
    assert trained.translate_ids(texts, **greedy, batch_size=2) == expected
    assert trained.translate_ids(texts, **greedy, use_cache=False) == expected


@pytest.mark.slow
@pytest.mark.once
def test_training_sanity(trained):
    # Thirty quick epochs of the copy task: most training sentences come back.
    out = trained.translate(SOURCES[:40])
    assert sum(a == b for a, b in zip(out, SOURCES[:40], strict=True)) >= 30


@pytest.mark.slow
def test_keras_file_round_trip(trained, proto, tmp_path):
    translator = Translator(
        trained.tokenizer, trained.transformer, max_output_length=30
    )
    path = os.path.join(tmp_path, "translator.keras")
    translator.save(path)
    with warnings.catch_warnings():
        # keras-hub 0.32 reads the vocabulary asset with open() and no
        # close(): a ResourceWarning, which is not ours to fix.
        warnings.simplefilter("ignore", ResourceWarning)
        loaded = keras.saving.load_model(path)
    assert type(loaded) is Translator
    assert loaded.tokenizer.proto == proto
    assert loaded.max_output_length == 30
    for a, b in zip(
        loaded.transformer.get_weights(),
        trained.transformer.get_weights(),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    texts = SOURCES[:10] + ["", "seven hundred"]
    assert loaded.translate(texts) == translator.translate(texts)
    assert loaded.translate_ids(texts) == translator.translate_ids(texts)


@pytest.mark.slow
@pytest.mark.once
def test_empty_and_unseen_characters(trained):
    texts = ["", "Ω", "one # two"]
    src = tk.encode(trained.tokenizer, texts)
    assert tk.UNK_ID in src[1] and tk.UNK_ID in src[2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = trained.translate(texts, max_output_length=4)
        ids = trained.translate_ids(texts, beam_size=1, max_output_length=4)
    ours = [w for w in caught if issubclass(w.category, UserWarning)]
    # Not silent: one warning per call names how many sources had <unk>.
    assert len(ours) == 2
    assert all("2 of 3 sources" in str(w.message) for w in ours)
    assert len(out) == 3 and all(isinstance(text, str) for text in out)
    # The empty source is not searched (TranslatorBase.output_limit).
    expected = [
        naive_greedy(trained.transformer, row, 4) if row[:-1] else [] for row in src
    ]
    assert ids == expected


def warns_max_length(call, limit):
    """Run ``call``; check it warned once about ``max_length=limit``.

    (Recorded rather than ``pytest.warns``, which re-emits the other warnings
    caught, e.g. Keras' own NumPy-2 ``__array__`` deprecation on PyTorch.)
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    ours = [w for w in caught if issubclass(w.category, UserWarning)]
    assert len(ours) == 1 and f"max_length={limit}" in str(ours[0].message)
    return result


@pytest.mark.slow
@pytest.mark.once
def test_too_long_source_warns_and_is_truncated(tokenizer):
    translator = Translator(tokenizer, tiny_model(tokenizer, max_length=16))
    long_text = "seven hundred seventy-seven thousand seven hundred seventy-seven"
    full = tk.encode(tokenizer, [long_text])[0]
    assert len(full) > 16
    ids = warns_max_length(
        lambda: translator.translate_ids(
            [long_text, "one"], beam_size=1, max_output_length=5
        ),
        16,
    )
    # The first 15 tokens and END: decoded as if given that way.
    cut = full[:15] + [tk.END_ID]
    assert ids[0] == naive_greedy(translator.transformer, cut, 5)
    out = warns_max_length(lambda: translator.translate([long_text]), 16)
    assert len(out) == 1 and isinstance(out[0], str)
    # Output is capped by max_length as well (16 tokens, not 15 + 50).
    (row,) = warns_max_length(lambda: translator.translate_ids([long_text]), 16)
    assert len(row) <= 16 and (row[-1] == tk.END_ID or len(row) == 16)


@pytest.mark.once
def test_bad_arguments(tokenizer):
    translator = Translator(tokenizer, tiny_model(tokenizer))
    with pytest.raises(ValueError, match="max_output_length"):
        translator.translate(["one"], max_output_length=0)
    with pytest.raises(TypeError):
        translator.translate(["one"], max_output_length=2.5)
    small = build_model("tiny", src_vocab_size=10, **SMALL)
    with pytest.raises(ValueError, match="vocabulary"):
        Translator(tokenizer, small)
    # A tokenizer outside the contract (say keras-hub's) is named, not probed.
    with pytest.raises(TypeError, match="TextTokenizer contract.*SimpleNamespace"):
        Translator(types.SimpleNamespace(tokenize=None), tiny_model(tokenizer))


def naive_beam(model, src_ids, beam_size, alpha, limit):
    """``numpy_reference.beam_search`` with log-probabilities from the model
    on each prefix, one hypothesis at a time."""

    def next_log_probs(tokens):
        logits = next_logits(model, src_ids, [tk.START_ID, *tokens])
        return numpy_reference.log_softmax(logits)

    return numpy_reference.beam_search(next_log_probs, beam_size, alpha, limit)


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_matches_naive_reference(trained, alpha):
    texts = [SOURCES[i] for i in (3, 57, 199)] + [""]
    src = tk.encode(trained.tokenizer, texts)
    limit = 7
    expected = [
        naive_beam(trained.transformer, row, 3, alpha, limit)
        if row[:-1]
        else [([], 0.0)]
        for row in src
    ]
    # Not trivial: some best hypotheses end with END, some at the limit, and
    # beams hold finished and unfinished hypotheses of several lengths.
    lengths = {len(ids) for beam in expected for ids, _ in beam}
    assert len(lengths) >= 2 and limit in lengths
    for use_cache in (True, False):
        got = trained.decode_ids(
            src, beam_size=3, length_penalty=alpha, max_output_length=limit,
            use_cache=use_cache,
        )  # fmt: skip
        for beam, reference in zip(got, expected, strict=True):
            assert [ids for ids, _ in beam] == [ids for ids, _ in reference]
            np.testing.assert_allclose(
                [score for _, score in beam],
                [score for _, score in reference],
                rtol=1e-4,
                atol=1e-5,  # float32 log-probabilities against float64
            )
    best = trained.translate_ids(
        texts, beam_size=3, length_penalty=alpha, max_output_length=limit
    )
    assert best == [reference[0][0] for reference in expected]


@pytest.mark.slow
def test_beam_size_one_is_greedy(trained):
    texts = SOURCES[::9]
    greedy = [
        naive_greedy(trained.transformer, row, 12)
        for row in tk.encode(trained.tokenizer, texts[:4])
    ]
    assert trained.translate_ids(texts[:4], beam_size=1, max_output_length=12) == greedy
    # beam_size=1 runs the greedy loop; the beam loop with one beam agrees.
    from keras_transformer.search import decoding

    src = np.zeros((len(texts), 16), "int32")
    for i, row in enumerate(tk.encode(trained.tokenizer, texts)):
        src[i, : len(row)] = row
    tokens, _ = decoding.greedy_search(trained.transformer, src, 12)
    beam_tokens, _, _ = decoding.beam_search(trained.transformer, src, 12, beam_size=1)
    np.testing.assert_array_equal(beam_tokens[:, 0], tokens)


@pytest.mark.once
def test_n_best(trained):
    """The n best are the search's first n hypotheses, read as text.

    The hypotheses are distinct as token sequences, not always as texts: a
    tokenizer spells one text more than one way (an extra word-boundary
    piece, ``▁ ▁ t e n`` and ``▁ t e n``, both read "ten"), and which
    spellings a partly trained model ranks among its best depends on the
    last bits of its weights, so on the CPU that trained it.
    """
    texts = SOURCES[:6]
    n_best = trained.n_best(texts, n=3, beam_size=4)
    assert len(n_best) == len(texts)
    hypotheses = trained.decode_ids(trained.encode_sources(texts), beam_size=4)
    best = trained.translate(texts, beam_size=4)
    for row, beam, first in zip(n_best, hypotheses, best, strict=True):
        assert len(row) == 3 and len(beam) == 4
        scores = [score for _, score in row]
        assert scores == sorted(scores, reverse=True) and all(s <= 0 for s in scores)
        assert row[0][0] == first
        assert scores == [score for _, score in beam[:3]]
        ids = [tuple(ids) for ids, _ in beam[:3]]
        assert [text for text, _ in row] == trained.detokenize(ids)
        assert len(set(ids)) == 3  # distinct hypotheses


@pytest.mark.slow
def test_the_beam_of_top_n_k_begins_with_that_of_any_smaller_top_n(trained):
    """A search of the whole beam (``top_n=beam_size``) serves every n
    best: its first n hypotheses are those of ``top_n=n`` (``n_best(n)``),
    its best that of ``top_n=1`` (``translate``). The beams are the same
    until a smaller ``top_n`` stops early, and its n best can no longer be
    outranked then."""
    # A batch stops when all its rows are done: small batches, so that some
    # stop early under top_n=1 however the partly trained model ranks.
    search = trained.search_options(
        beam_size=4, batch_size=4, fixed_batch=True, max_output_length=12
    )
    sources = sorted(trained.encode_sources(SOURCES[::10]), key=len)
    found = {n: trained.search_ids_sorted(sources, search, top_n=n) for n in (1, 2, 4)}
    for n in (1, 2):
        for short, full in zip(found[n], found[4], strict=True):
            # The same ids and scores: one compiled program, top_n its input.
            assert short[:n] == full[:n]
    # top_n=1 stopped early somewhere: what follows its best differs.
    assert any(s[1:] != f[1:] for s, f in zip(found[1], found[4], strict=True))


@pytest.mark.slow
@pytest.mark.once
def test_bad_search_arguments(trained):
    with pytest.raises(ValueError, match="beam_size must be >= 1"):
        trained.translate(["one"], beam_size=0)
    with pytest.raises(TypeError, match="beam_size"):
        trained.translate(["one"], beam_size=2.0)
    with pytest.raises(ValueError, match="length_penalty must be >= 0"):
        trained.translate(["one"], length_penalty=-0.5)
    with pytest.raises(ValueError, match="n must be between 1 and beam_size=2"):
        trained.n_best(["one"], n=3, beam_size=2)


@pytest.mark.once
def test_verbose_shows_sentences_done_on_stderr(tokenizer, capsys):
    translator = Translator(tokenizer, tiny_model(tokenizer))
    texts = ["one", "two", "three", "four", "five"]
    quiet = translator.translate(texts, max_output_length=3, batch_size=2)
    assert capsys.readouterr().err == ""
    loud = translator.translate(texts, max_output_length=3, batch_size=2, verbose=1)
    assert loud == quiet
    (line,) = capsys.readouterr().err.splitlines()  # not a terminal: the end
    assert line.startswith("5/5 sentences, ") and line.endswith(" in all")
    translator.n_best(texts[:2], n=2, beam_size=2, max_output_length=3, verbose=1)
    assert capsys.readouterr().err.startswith("2/2 sentences, ")
    for bad in (2, 0.5, 1.0, "1"):
        with pytest.raises(ValueError, match="verbose must be 0 or 1"):
            translator.translate(texts, verbose=bad)
    # Refused before any sentence is read (the texts are not even text).
    with pytest.raises(ValueError, match="verbose must be 0 or 1"):
        translator.n_best([None], verbose=2)


@pytest.mark.once
def test_search_options_are_one_value_checked_once(trained, monkeypatch):
    from keras_transformer import SearchOptions
    from keras_transformer.search import options

    checks = []
    real = options.check_beam_size
    monkeypatch.setattr(
        options, "check_beam_size", lambda b: checks.append(b) or real(b)
    )
    texts = SOURCES[:3]
    for method in ("translate", "translate_ids", "n_best"):
        checks.clear()
        getattr(trained, method)(texts, beam_size=1, max_output_length=6)
        assert checks == [1], method
    greedy = SearchOptions(beam_size=1, max_output_length=6)
    checks.clear()
    trained.translate(texts, search=greedy)
    assert checks == []  # checked when it was made
    assert trained.translate(texts, search=greedy) == trained.translate(
        texts, beam_size=1, max_output_length=6
    )
    # Keyword options replace the given value's fields.
    assert trained.translate(texts, search=greedy, beam_size=2) == trained.translate(
        texts, beam_size=2, max_output_length=6
    )
    with pytest.raises(TypeError, match=r"Unknown search options \['beam'\]"):
        trained.translate(texts, beam=2)
    with pytest.raises(TypeError, match="search must be a SearchOptions"):
        trained.translate(texts, 2)
    with pytest.raises(ValueError, match="beam_size must be >= 1"):
        SearchOptions(beam_size=0)


@pytest.mark.once
def test_n_best_gives_the_searchs_own_scores(trained, monkeypatch):
    from keras_transformer.search import decoding

    returned = []
    real = decoding.beam_search

    def recording(*args, **kwargs):
        result = real(*args, **kwargs)
        returned.append(result[1])
        return result

    monkeypatch.setattr(decoding, "beam_search", recording)
    texts = SOURCES[:4]
    n_best = trained.n_best(texts, n=2, beam_size=3, batch_size=4)
    (scores,) = returned  # one batch; rows sorted by length, none padded out
    lengths = [len(ids) for ids in trained.encode_sources(texts)]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    for row, i in enumerate(order):
        assert [score for _, score in n_best[i]] == [float(s) for s in scores[row, :2]]


@pytest.mark.slow
@pytest.mark.once
def test_a_mixed_precision_model_translates_in_float32(trained, tmp_path):
    """A transformer trained under mixed_bfloat16 keeps float32 weights: by
    default its translator searches with a float32 copy of them (the same
    translations as the float32 model), and with search_dtype="policy" in
    its own bfloat16; the choice survives a save."""
    model = trained.transformer
    mixed = build_model(
        "tiny",
        src_vocab_size=model.src_vocab_size,
        dtype="mixed_bfloat16",
        **SMALL,
    )
    mixed.set_weights(model.get_weights())
    translator = Translator(trained.tokenizer, mixed)
    assert translator.search_compute_dtype == "float32"
    assert translator.engine == f"keras {keras.backend.backend()} float32"
    texts = SOURCES[::7]
    expected = trained.translate(texts, beam_size=2)
    assert translator.translate(texts, beam_size=2) == expected
    assert mixed.target_embedding.compute_dtype == "bfloat16"  # itself unchanged
    # The copy is not the translator's state: not among its weights, not
    # saved with it.
    assert translator._float32_copy.model is not None
    assert len(translator.weights) == len(mixed.weights)
    saved = tmp_path / "float32.keras"
    translator.save(saved)
    with zipfile.ZipFile(saved) as archive:
        with h5py.File(io.BytesIO(archive.read("model.weights.h5"))) as weights:
            groups = []
            weights.visit(groups.append)
    assert groups and not any("float32_copy" in group for group in groups)
    # Its weights are read at every call: a change reaches the copy.
    mixed.set_weights([w * 0.0 for w in model.get_weights()])
    assert translator.translate(texts[:2], beam_size=1) != expected[:2]
    mixed.set_weights(model.get_weights())

    policy = Translator(trained.tokenizer, mixed, search_dtype="policy")
    assert policy.search_compute_dtype == "bfloat16"
    tokens = policy.translate_ids(texts, beam_size=1)
    assert all(isinstance(t, int) for row in tokens for t in row)
    path = tmp_path / "policy.keras"
    policy.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        loaded = keras.saving.load_model(path)
    assert loaded.search_dtype == "policy"
    with pytest.raises(ValueError, match="search_dtype must be one of"):
        Translator(trained.tokenizer, mixed, search_dtype="bfloat16")


@pytest.mark.once  # which shapes are searched is the translator's, not the backend's
def test_warm_up_searches_every_shape_a_fixed_batch_can_take(trained, monkeypatch):
    """Every (rows, source width, output width) that fixed_batch calls of
    any size and length give the search was given to it by warm_up, and
    those calls translate as the translator does without the options."""
    from keras_transformer.data.batching import bucket_length
    from keras_transformer.search import decoding

    translator = Translator(trained.tokenizer, trained.transformer)
    shapes = []
    search = decoding.beam_search

    def recording(model, source_ids, max_lengths, beam_size, alpha, width, *a, **k):
        shapes.append((*source_ids.shape, width))
        return search(model, source_ids, max_lengths, beam_size, alpha, width, *a, **k)

    monkeypatch.setattr(decoding, "beam_search", recording)
    options = dict(batch_size=4, fixed_batch=True, beam_size=2)
    limit = translator.source_max_length

    def bucket(length):
        return bucket_length(
            min(length, limit), limit, min_length=8, step=2, multiple=8
        )

    widths = {(bucket(n), bucket(n - 1 + 50)) for n in range(1, limit + 1)}
    assert translator.warm_up(**options) == len(widths) >= 2
    assert set(shapes) == {(4, *pair) for pair in widths}
    warmed, shapes[:] = set(shapes), []
    texts = [SOURCES[i] for i in (3, 150, 7, 199, 42, 11, 0)] + ["one " * 40]
    got = [translator.translate(texts[:n], **options) for n in (1, 2, 3, 8)]
    assert shapes and set(shapes) <= warmed
    # A text's translation does not depend on the others in its call (tested
    # in test_translator_interface.py), so one reference call serves all.
    expected = trained.translate(texts, beam_size=2)
    assert got == [expected[:n] for n in (1, 2, 3, 8)]
