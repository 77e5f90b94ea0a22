"""The CTranslate2 export and its translator, against our own Translator.

Per backend (the export reads the weights and computes the position table
with the current backend): the forward pass of the exported model against
the Keras model's log-softmax, token by token, for post-LN with shared
embeddings and pre-LN with separate ones; greedy and beam-4 translations of
the trained number-task translator of 0.2.0 (tests/fixtures/v0_2_0) against
``Translator.translate``; n-best scores; per-sentence output limits; an int8
export. Marked ``once``: argument checks and errors, the same on every
backend.
"""

import gc
import json
import os
import pathlib
import subprocess
import sys
import warnings

import ctranslate2
import keras
import numpy as np
import pytest

from keras_transformer import build_model
from keras_transformer.data import tokenizer as tk
from keras_transformer.data.numbers import EDGE_NUMBERS, english
from keras_transformer.export import ctranslate2 as kt_ct2
from keras_transformer.search.options import SearchOptions
from keras_transformer.special_tokens import END_ID
from keras_transformer.translate.keras_translator import Translator

FIXTURE = os.path.join(
    os.path.dirname(__file__), "fixtures", "v0_2_0", "translator.keras"
)
NUMBERS = list(EDGE_NUMBERS) + [
    int(n) for n in np.random.default_rng(0).integers(0, 1_000_000, 56)
]
SENTENCES = [english(n) for n in NUMBERS]  # 64 sentences
# Tiny models whose forward pass is compared: (config, src and tgt vocab sizes
# beyond the tokenizer's 60 pieces, so that the vocabulary is padded too). The
# first also has the options of imported checkpoints (swish, a logits bias);
# the second is made never to end (below).
MODELS = {
    "post_ln_shared": dict(
        share_embeddings=True,
        norm_first=False,
        vocab=(60, 60),
        activation="swish",
        logits_bias=True,
    ),
    "pre_ln_separate": dict(share_embeddings=False, norm_first=True, vocab=(64, 62)),
}


def load(path):
    with warnings.catch_warnings():
        # keras-hub 0.32 leaves the vocabulary asset open (test_compat.py).
        warnings.simplefilter("ignore", ResourceWarning)
        model = keras.saving.load_model(path)
        gc.collect()
    return model


@pytest.fixture(scope="module")
def numbers():
    """The trained translator of 0.2.0: English number words to German."""
    translator = load(FIXTURE)
    assert isinstance(translator, Translator)
    return translator


@pytest.fixture(scope="module")
def exported(numbers, tmp_path_factory):
    return kt_ct2.export_ctranslate2(numbers, tmp_path_factory.mktemp("ct2") / "m")


@pytest.fixture(scope="module")
def fast(exported):
    return kt_ct2.load_ctranslate2(exported)


def pad(rows):
    array = np.zeros((len(rows), max(map(len, rows))), "int32")
    for i, row in enumerate(rows):
        array[i, : len(row)] = row
    return array


def log_softmax(logits):
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def tiny_translator(numbers, share_embeddings, norm_first, vocab, **options):
    keras.utils.set_random_seed(1)
    model = build_model(
        "tiny",
        src_vocab_size=vocab[0],
        tgt_vocab_size=vocab[1],
        num_layers=2,
        d_model=32,
        num_heads=4,
        d_ff=48,
        max_length=64,
        share_embeddings=share_embeddings,
        norm_first=norm_first,
        layer_norm_epsilon=1e-5,
        **options,
    )
    # Make the weights less tidy than their initial values (zero biases,
    # unit gammas), so that each one matters.
    rng = np.random.default_rng(2)
    for variable in model.weights:
        value = keras.ops.convert_to_numpy(variable)
        variable.assign(value + rng.normal(0, 0.05, value.shape).astype(value.dtype))
    return Translator(tk.make_tokenizer(numbers.tokenizer.proto), model)


# -- the forward pass -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(numbers, tmp_path_factory):
    """Per MODELS entry: ``(translator, CTranslate2Translator)``, the second
    exported from the first saved as .keras in this backend and reloaded.
    The pre-LN one is made to prefer <pad> and <s> (its final norm's bias
    points at their embeddings), for the tests of what is never generated.
    """
    made = {}
    for name, settings in MODELS.items():
        translator = tiny_translator(numbers, **settings)
        if name == "pre_ln_separate":
            table = keras.ops.convert_to_numpy(
                translator.transformer.target_embedding.embeddings
            )
            direction = table[0] + table[1]
            translator.transformer.decoder_norm.beta.assign(
                3.0 * direction / np.linalg.norm(direction)
            )
        folder = tmp_path_factory.mktemp(name)
        translator.save(folder / "t.keras")
        out = kt_ct2.export_ctranslate2(str(folder / "t.keras"), folder / "ct2")
        made[name] = translator, kt_ct2.load_ctranslate2(out)
    return made


@pytest.mark.parametrize("name", sorted(MODELS))
def test_scores_equal_the_keras_models_log_softmax(numbers, tiny, name):
    """CTranslate2's per-token log-probabilities of given targets are the
    Keras model's: real sentences, and one source and one target as long as
    the model's max_length (the last row of the position table)."""
    translator, fast = tiny[name]
    metadata = json.loads(
        (pathlib.Path(fast.path) / "keras_transformer.json").read_text()
    )
    assert metadata["model"]["norm_first"] == MODELS[name]["norm_first"]
    assert metadata["model"]["layer_norm_epsilon"] == 1e-5
    # The languages the Keras translator records (none here) travel along.
    assert metadata["languages"] is None and fast.languages is None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the long one is cut
        sources = fast.encode_sources(SENTENCES[:11] + [" ".join(SENTENCES[50:])])
    targets = tk.encode(translator.tokenizer, [english(n) for n in NUMBERS[12:23]])
    targets = [row[:-1] for row in targets] + [[5, 6, 7] * 21]  # 63 + </s>
    assert len(sources[-1]) == len(targets[-1]) + 1 == 64
    scored = fast.translator.score_batch(
        [[fast._source_pieces[i] for i in row] for row in sources],
        [[fast._target_pieces[i] for i in row] for row in targets],
        max_input_length=0,
    )
    logits = translator.transformer.predict(
        {
            "encoder_inputs": pad(sources),
            "decoder_inputs": pad([[1] + row for row in targets]),
        },
        verbose=0,
    )
    expected = log_softmax(logits)
    for i, (result, row) in enumerate(zip(scored, targets, strict=True)):
        row = row + [2]  # the end token is scored too
        assert result.tokens == [fast._target_pieces[t] for t in row]
        want = expected[i, np.arange(len(row)), row]
        np.testing.assert_allclose(result.log_probs, want, atol=1e-5, rtol=0)


# -- translations of the trained translator ------------------------------------------


@pytest.fixture(scope="module")
def ours(numbers):
    """Our Translator's greedy and beam-4 hypotheses ``(ids, score)``."""
    sources = numbers.encode_sources(SENTENCES)
    return {beam: numbers.decode_ids(sources, beam_size=beam) for beam in (1, 4)}


def test_greedy_equals_the_translators(numbers, fast, ours):
    ids = [row[0][0] for row in ours[1]]
    assert fast.translate_ids(SENTENCES, beam_size=1) == ids
    assert fast.translate(SENTENCES, beam_size=1) == tk.decode(numbers.tokenizer, ids)
    # Scores: log P / lp(Y), as the Translator gives them.
    for got, want in zip(fast.n_best(SENTENCES, beam_size=1), ours[1], strict=True):
        assert len(got) == 1
        np.testing.assert_allclose(got[0][1], want[0][1], atol=1e-4)


def test_beam_search_equals_the_translators(numbers, fast, ours):
    best = [row[0][0] for row in ours[4]]
    assert fast.translate_ids(SENTENCES) == best
    got = fast.n_best(SENTENCES, n=3)
    for hypotheses, reference in zip(got, ours[4], strict=True):
        assert len(hypotheses) == 3
        scores = [score for _, score in hypotheses]
        assert scores == sorted(scores, reverse=True)
        # The best is ours, with our GNMT score.
        assert hypotheses[0][0] == tk.decode(numbers.tokenizer, [reference[0][0]])[0]
        np.testing.assert_allclose(scores[0], reference[0][1], atol=1e-4)
    # Another alpha is another ranking, still ours.
    assert fast.translate(SENTENCES, length_penalty=2.0) == numbers.translate(
        SENTENCES, length_penalty=2.0
    )


def test_a_fixed_output_length_cuts_as_the_translators(fast, ours):
    # Greedy: the first three tokens of the unlimited output.
    greedy = fast.translate_ids(SENTENCES, beam_size=1, max_output_length=3)
    assert greedy == [row[0][0][:3] for row in ours[1]]
    assert max(map(len, greedy)) == 3
    beam = fast.decode_ids(fast.encode_sources(SENTENCES), max_output_length=3)
    assert max(len(ids) for row in beam for ids, _ in row) == 3


def test_int8_translates_close_to_float32(numbers, fast, ours, tmp_path):
    out = kt_ct2.export_ctranslate2(numbers, tmp_path / "int8", quantization="int8")
    metadata = json.loads((tmp_path / "int8" / "keras_transformer.json").read_text())
    assert metadata["quantization"] == "int8"
    assert os.path.getsize(os.path.join(out, "model.bin")) < 0.5 * os.path.getsize(
        os.path.join(fast.path, "model.bin")
    )
    int8 = kt_ct2.load_ctranslate2(out)
    assert "int8" in int8.translator.compute_type
    assert int8.default_batch_size == kt_ct2.DEFAULT_BATCH_SIZES["int8"]
    reference = [row[0][0] for row in ours[4]]
    same = sum(
        a == b for a, b in zip(int8.translate_ids(SENTENCES), reference, strict=True)
    )
    assert same >= 0.9 * len(SENTENCES)


def test_too_long_and_unknown_sources_warn_as_the_translators(numbers, fast):
    sentences = [" ".join([english(777_777)] * 6), "seven €"]
    with pytest.warns(UserWarning) as ours:
        want = numbers.encode_sources(sentences)
    with pytest.warns(UserWarning) as record:
        assert fast.encode_sources(sentences) == want
    messages = sorted(str(w.message) for w in record)
    assert messages == sorted(str(w.message) for w in ours)
    assert any("max_length=64" in m for m in messages)
    assert any("never seen" in m for m in messages)
    assert len(want[0]) == 64 and want[0][-1] == 2
    with pytest.warns(UserWarning):
        assert len(fast.translate(sentences, beam_size=1)) == 2


# -- an untrained model: output limits, and what is never generated -----------------

# Sources of different lengths, so that each has its own output limit.
LIMITED = [english(n) for n in (7, 101, 3, 21, 99)]


def test_pad_and_start_are_never_generated(tiny):
    """CTranslate2 alone generates <pad> and <s> with this model; the
    translator never does, and its greedy tokens are the Keras model's
    argmax over the other tokens at each step (teacher forcing)."""
    translator, fast = tiny["pre_ln_separate"]
    sources = fast.encode_sources(LIMITED)
    raw = fast.translator.translate_batch(
        [[fast._source_pieces[i] for i in row] for row in sources],
        beam_size=1,
        max_decoding_length=10,
    )
    assert any({"<pad>", "<s>"} & set(r.hypotheses[0]) for r in raw)
    greedy = fast.decode_ids(sources, beam_size=1)
    logits = translator.transformer.predict(
        {
            "encoder_inputs": pad(sources),
            "decoder_inputs": pad([[1] + row[0][0][:-1] for row in greedy]),
        },
        verbose=0,
    )
    logits[:, :, [0, 1]] = -np.inf
    # Scores: log-probabilities over the tokens but <pad> and <s>, as ours.
    log_probs = log_softmax(logits)
    for row, step_log_probs, [(ids, score)] in zip(
        logits, log_probs, greedy, strict=True
    ):
        assert ids == row[: len(ids)].argmax(-1).tolist()
        log_p = step_log_probs[np.arange(len(ids)), ids].sum()
        np.testing.assert_allclose(
            score, log_p / ((5 + len(ids)) / 6) ** 0.6, rtol=1e-5
        )
    beam = fast.decode_ids(sources, beam_size=2)
    assert not any({0, 1} & set(ids) for row in beam for ids, _ in row)


def test_each_sentence_has_its_own_output_limit(tiny):
    """The model never ends: every output runs to its sentence's own limit
    (source length + 50; all in one batch); beam search gives what
    CTranslate2 gives for each sentence alone with that limit, re-ranked by
    the GNMT score."""
    _, fast = tiny["pre_ln_separate"]
    sources = fast.encode_sources(LIMITED)
    limits = [len(row) - 1 + 50 for row in sources]
    assert len(set(limits)) == len(limits) and max(limits) <= 64
    assert [len(ids) for ids in fast.translate_ids(LIMITED, beam_size=1)] == limits
    beam = fast.decode_ids(sources, beam_size=3)
    for source, limit, hypotheses in zip(sources, limits, beam, strict=True):
        alone = fast.translator.translate_batch(
            [[fast._source_pieces[i] for i in source]],
            beam_size=3,
            patience=fast.patience,
            num_hypotheses=fast._pool(3),
            length_penalty=1.0,
            max_input_length=0,
            max_decoding_length=limit,
            min_decoding_length=0,
            return_scores=True,
            return_end_token=True,
            suppress_sequences=[["<pad>"], ["<s>"]],
        )[0]
        assert max(len(tokens) for tokens in alone.hypotheses) == limit
        # Re-ranked by the GNMT score, from log P = score * |Y|.
        ranked = sorted(
            zip(alone.hypotheses, alone.scores, strict=True),
            key=lambda h: -h[1] * len(h[0]) / ((5 + len(h[0])) / 6) ** 0.6,
        )
        assert len(hypotheses) == 3
        for (ids, score), (tokens, ct2_score) in zip(hypotheses, ranked, strict=False):
            assert ids == [fast._target_ids[t] for t in tokens]
            np.testing.assert_allclose(
                score, ct2_score * len(ids) / ((5 + len(ids)) / 6) ** 0.6, rtol=1e-5
            )


def test_transformers_greedy_search_ends_at_the_limit_as_the_translators(tiny):
    """The model never ends; with transformers' greedy search (an imported
    model's) each output ends with the end token in its limit's last place,
    on both engines alike, with the same scores, down to a limit of 1
    (where CTranslate2 is asked for one token, the least it decodes)."""
    translator, fast = tiny["pre_ln_separate"]
    sources = fast.encode_sources(LIMITED)
    for limit in (1, 2, None):
        search = SearchOptions(
            beam_size=1, length_penalty_form="transformers", max_output_length=limit
        )
        ours = [row[0] for row in translator.decode_ids(sources, search)]
        theirs = [row[0] for row in fast.decode_ids(sources, search)]
        assert [ids for ids, _ in theirs] == [ids for ids, _ in ours], limit
        assert all(ids[-1] == END_ID for ids, _ in ours)
        limits = [len(row) - 1 + 50 if limit is None else limit for row in sources]
        assert [len(ids) for ids, _ in ours] == limits
        np.testing.assert_allclose(
            [score for _, score in theirs], [score for _, score in ours], rtol=1e-5
        )
        if limit == 1:  # the end token alone, forced: probability 1
            assert theirs == [([END_ID], 0.0)] * len(sources)
        else:
            assert all(score < 0 for _, score in theirs)


# -- the directory and the errors -----------------------------------------------------


def test_the_directory(fast, numbers):
    files = set(os.listdir(fast.path))
    assert {
        "model.bin",
        "config.json",
        "tokenizer.model",
        "keras_transformer.json",
    } <= files
    folder = pathlib.Path(fast.path)
    metadata = json.loads((folder / "keras_transformer.json").read_text())
    assert metadata["max_length"] == numbers.transformer.max_length == 64
    assert metadata["special_ids"] == {"pad": 0, "start": 1, "end": 2, "unk": 3}
    assert "GNMT" in metadata["length_penalty"]["mapping"]
    config = json.loads((folder / "config.json").read_text())
    assert config["decoder_start_token"] == "<s>"
    assert config["layer_norm_epsilon"] == pytest.approx(1e-6)
    assert (folder / "tokenizer.model").read_bytes() == bytes(numbers.tokenizer.proto)
    hidden = [name for name in os.listdir(folder.parent) if name.startswith(".")]
    assert not hidden  # no temporary folder left


@pytest.mark.once
def test_bad_texts_and_options_fail_as_the_translators(numbers, fast):
    cases = [
        dict(texts="seven"),
        dict(texts=[None]),
        dict(texts=["one", b"two"]),
        dict(texts=[42]),
        dict(texts=["\ud800"]),
        dict(texts=["one"], beam_size=0),
        dict(texts=["one"], length_penalty="0.6"),
        dict(texts=["one"], beams=2),
        dict(texts=["one"], max_output_length=0),
        dict(texts=["one"], length_penalty_form="marian"),
    ]
    for case in cases:
        errors = []
        for translator in (numbers, fast):
            with pytest.raises((TypeError, ValueError)) as info:
                translator.translate(**case)
            errors.append((type(info.value), str(info.value)))
        assert errors[0] == errors[1], case
    for n in (0, 5, 1.0):
        with pytest.raises((TypeError, ValueError)) as ours:
            numbers.n_best(["one"], n=n)
        with pytest.raises(type(ours.value), match=str(ours.value)):
            fast.n_best(["one"], n=n)
    assert fast.translate([]) == []
    # transformers' beam search is the Keras engine's alone, and so are
    # constrained searches: a glossary is refused, not ignored.
    with pytest.raises(ValueError, match="beyond greedy search, searches with"):
        fast.translate(["one"], beam_size=2, length_penalty_form="transformers")
    assert not fast.takes_constraints
    for terms in (dict(glossary={"one": "eins"}), dict(constraints=[["eins"]])):
        with pytest.raises(ValueError, match="cannot follow a glossary"):
            fast.translate(["one"], **terms)


@pytest.mark.once
def test_verbose_reports_progress(fast, capsys):
    texts = fast.translate(SENTENCES[:4], beam_size=1, verbose=1, use_cache=False)
    assert len(texts) == 4
    assert "4/4 sentences" in capsys.readouterr().err
    assert repr(fast).endswith("(ctranslate2 float32)>")


@pytest.mark.once
def test_bad_quantization_names_the_accepted_ones(numbers, tmp_path):
    with pytest.raises(ValueError, match="int8_float32") as info:
        kt_ct2.export_ctranslate2(numbers, tmp_path / "m", quantization="int4")
    assert "float16" in str(info.value)
    assert not os.path.exists(tmp_path / "m")


@pytest.mark.once
def test_an_existing_directory_is_kept_unless_overwrite(numbers, exported, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        kt_ct2.export_ctranslate2(numbers, out)
    assert os.listdir(out) == ["mine.txt"]
    assert (out / "mine.txt").read_text() == "keep me"
    kt_ct2.export_ctranslate2(numbers, out, overwrite=True)
    assert "mine.txt" not in os.listdir(out)
    assert sorted(os.listdir(out)) == sorted(os.listdir(exported))
    assert os.listdir(tmp_path) == ["m"]  # no temporary folder left
    # An empty directory is taken as it is.
    (tmp_path / "empty").mkdir()
    kt_ct2.export_ctranslate2(numbers, tmp_path / "empty")
    assert "model.bin" in os.listdir(tmp_path / "empty")


@pytest.mark.once
def test_a_failed_export_leaves_nothing(numbers, tmp_path, monkeypatch):
    from ctranslate2.specs import transformer_spec

    def fail(self, output_dir):
        pathlib.Path(output_dir, "model.bin").write_bytes(b"half")
        raise OSError("disk on fire")

    monkeypatch.setattr(transformer_spec.TransformerSpec, "save", fail)
    with pytest.raises(OSError, match="disk on fire"):
        kt_ct2.export_ctranslate2(numbers, tmp_path / "m")
    assert os.listdir(tmp_path) == []


@pytest.mark.once
def test_a_file_without_a_translator_is_refused(tmp_path):
    model = build_model("tiny", src_vocab_size=30, num_layers=1, d_model=16, d_ff=16)
    model.save(tmp_path / "bare.keras")
    with pytest.raises(ValueError, match="not a keras_transformer Translator"):
        kt_ct2.export_ctranslate2(str(tmp_path / "bare.keras"), tmp_path / "m")
    with pytest.raises(TypeError, match="Translator"):
        kt_ct2.export_ctranslate2(model, tmp_path / "m")
    with pytest.raises(ValueError, match="not a directory written by"):
        kt_ct2.load_ctranslate2(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["bare.keras"]


@pytest.mark.once
def test_without_ctranslate2_the_error_says_what_to_install(
    numbers, tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    with pytest.raises(ImportError, match=r"keras-transformer-aiayn\[ctranslate2\]"):
        kt_ct2.export_ctranslate2(numbers, tmp_path / "m")
    with pytest.raises(ImportError, match="pip install ctranslate2"):
        kt_ct2.load_ctranslate2(tmp_path)


@pytest.mark.once
def test_translating_imports_neither_tensorflow_nor_keras_hub(exported):
    code = (
        "import sys\n"
        "from keras_transformer.export.ctranslate2 import load_ctranslate2\n"
        f"translator = load_ctranslate2({str(exported)!r})\n"
        "print(translator.translate(['seven'], beam_size=1))\n"
        "print(sorted({'tensorflow', 'keras_hub'} & set(sys.modules)))\n"
    )
    env = dict(os.environ, KERAS_BACKEND="jax")
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert result.stdout.split("\n")[:2] == ["['sieben']", "[]"]
    assert ctranslate2.__version__  # imported plainly: a test dependency
