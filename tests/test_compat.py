"""Files saved by keras_transformer 0.1.0 load, with the same logits and
translations, on every backend.

``tests/fixtures/v0_1_0/`` holds two bare ``build_model`` models and a
``Translator``, written by 0.1.0 on JAX (``make_fixtures.py``, with the
logits and translations it gave). 0.1.0 saved the functional graph as the
model's config; 0.2.0 reads its hyper-parameters from it.
"""

import contextlib
import json
import pathlib
import sys

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.data.sentencepiece_layer import SentencePieceTokenizer
from tests import numpy_reference as ref

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "v0_1_0"
EXPECTED = np.load(FIXTURES / "expected.npz")
TEXT = json.loads((FIXTURES / "expected.json").read_text())


def numpy_forward(model, x):
    """The model's logits from its weights, with the paper's equations in
    NumPy (float64): an independent check of what was loaded."""
    weights = lambda layer: ref._value(layer.embeddings)  # noqa: E731
    src, tgt = x["encoder_inputs"], x["decoder_inputs"]
    eps, heads = model.layer_norm_epsilon, model.num_heads

    def embed(table, ids):
        scaled = table[ids] * np.sqrt(model.d_model)
        return scaled + ref.sinusoidal_pe(range(ids.shape[1]), model.d_model)[None]

    def norm(layer, h):
        w = ref.layer_norm_weights(layer)
        return ref.layer_norm(h, w["gamma"], w["beta"], eps)

    src_mask, tgt_mask = src != 0, tgt != 0
    h = embed(weights(model.source_embedding), src)
    for block in model.encoder_blocks:
        h = ref.encoder_block(
            h, ref.block_weights(block), heads, src_mask, model.norm_first, eps
        )
    if model.encoder_norm is not None:
        h = norm(model.encoder_norm, h)
    y = embed(weights(model.target_embedding), tgt)
    for block in model.decoder_blocks:
        y = ref.decoder_block(
            y,
            h,
            ref.block_weights(block),
            heads,
            tgt_mask,
            src_mask,
            model.norm_first,
            eps,
        )
    if model.decoder_norm is not None:
        y = norm(model.decoder_norm, y)
    return y @ weights(model.target_embedding).T


@pytest.mark.parametrize("name", ["bare_post_ln", "bare_pre_ln"])
def test_bare_model_of_0_1_0_gives_the_same_logits(name):
    model = kt.load_model(FIXTURES / f"{name}.keras")
    assert isinstance(model, kt.Transformer)
    assert model.norm_first == (name == "bare_pre_ln")
    assert model.share_embeddings == (name == "bare_post_ln")
    assert len(model.encoder_blocks) == len(model.decoder_blocks) == 2
    x = {k: EXPECTED[f"bare/{k}"] for k in ("encoder_inputs", "decoder_inputs")}
    logits = model.predict(x, verbose=0)
    np.testing.assert_allclose(logits, EXPECTED[f"{name}/logits"], atol=1e-5)
    np.testing.assert_allclose(logits, numpy_forward(model, x), atol=1e-4)
    # Saved again, it is a 0.2.0 file: its config is the constructor's.
    config = model.get_config()
    assert config["num_layers"] == 2 and "layers" not in config


@pytest.mark.slow
def test_model_of_0_1_0_saved_again_loads_the_same(tmp_path):
    model = kt.load_model(FIXTURES / "bare_pre_ln.keras")
    model.save(tmp_path / "again.keras")
    again = kt.load_model(tmp_path / "again.keras")
    x = {k: EXPECTED[f"bare/{k}"] for k in ("encoder_inputs", "decoder_inputs")}
    np.testing.assert_array_equal(
        again.predict(x, verbose=0), model.predict(x, verbose=0)
    )


@contextlib.contextmanager
def keras_hub_missing():
    """keras-hub as if it were not installed: importing it raises
    ``ImportError`` (the files name its tokenizer; they must not need it)."""
    saved = {
        name: module
        for name, module in sys.modules.items()
        if name == "keras_hub" or name.startswith("keras_hub.")
    }
    for name in saved:
        del sys.modules[name]
    sys.modules["keras_hub"] = None
    try:
        yield
    finally:
        del sys.modules["keras_hub"]
        sys.modules.update(saved)


def test_translator_of_0_1_0_translates_the_same():
    with keras_hub_missing():
        translator = kt.load_model(FIXTURES / "translator.keras")
        with pytest.raises(ImportError):
            import keras_hub  # noqa: F401
    assert isinstance(translator, kt.Translator)
    assert type(translator.tokenizer) is SentencePieceTokenizer
    x = {k: EXPECTED[f"translator/{k}"] for k in ("encoder_inputs", "decoder_inputs")}
    # Called, not predict(): the file holds the compile settings of the JAX
    # run that wrote it (jit_compile=True), which on PyTorch means a
    # slow torch.compile of the predict step.
    logits = keras.ops.convert_to_numpy(translator.transformer(x))
    np.testing.assert_allclose(logits, EXPECTED["translator/logits"], atol=1e-5)
    sentences = TEXT["sentences"]
    assert translator.translate(sentences, beam_size=1) == TEXT["greedy"]
    assert translator.translate(sentences) == TEXT["beam4"]


# -- files of 0.2.0 ---------------------------------------------------------------

FIXTURES_0_2 = pathlib.Path(__file__).parent / "fixtures" / "v0_2_0"
EXPECTED_0_2 = np.load(FIXTURES_0_2 / "expected.npz")
TEXT_0_2 = json.loads((FIXTURES_0_2 / "expected.json").read_text())


FLOAT32_0_2 = np.load(FIXTURES_0_2 / "float32_logits.npz")
# bfloat16's unit roundoff: 8 bits of significand, round to nearest.
BF16_U = 2.0**-8


def bfloat16_roundings(model):
    """How many times a pre-LN model under ``mixed_bfloat16`` rounds the
    values that its logits are computed from, to first order.

    An attention sublayer rounds its normalised input, the projections, the
    scores, the weights (softmaxed in float32, then cast), their weighted
    sum, the output projection and the residual sum: 7; a feed-forward
    sublayer its normalised input, each dense layer's output and the
    residual sum: 4. The embeddings add 3 (the table cast, the sqrt(d_model)
    scale, the positions), the final norms and the output projection 3.
    """
    encoder = len(model.encoder_blocks) * (7 + 4)
    decoder = len(model.decoder_blocks) * (7 + 7 + 4)
    return 3 + encoder + decoder + 3


def float32_twin(model):
    """The same model and weights under the float32 policy."""
    twin = kt.Transformer.from_config({**model.get_config(), "dtype": "float32"})
    twin.set_weights(model.get_weights())
    return twin


def test_bare_model_of_0_2_0_gives_the_same_logits():
    """0.2.0 saved the constructor's arguments as the config."""
    model = kt.load_model(FIXTURES_0_2 / "bare_post_ln.keras")
    assert isinstance(model, kt.Transformer)
    assert model.encoder_blocks[0].dtype_policy.name == "float32"
    assert not model.norm_first and model.share_embeddings
    x = {k: EXPECTED_0_2[f"bare/{k}"] for k in ("encoder_inputs", "decoder_inputs")}
    logits = keras.ops.convert_to_numpy(model(x))
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, EXPECTED_0_2["bare_post_ln/logits"], atol=1e-5)
    np.testing.assert_allclose(logits, numpy_forward(model, x), atol=1e-4)


def test_bfloat16_model_of_0_2_0_gives_the_same_logits():
    """The file keeps its ``mixed_bfloat16`` policy, and its model is the
    one 0.2.0 saved.

    That the model is the same is checked in float32, against the float32
    logits 0.2.0 gave for the file's weights (``float32_logits.npz``): any
    CPU reproduces those. Its bfloat16 logits are not compared with the
    ones 0.2.0 gave (``expected.npz``): bfloat16 matrix products round
    differently on CPUs with bfloat16 instructions and without them, so
    those hold one CPU's rounding. They are compared with the float32
    logits of this run, within what bfloat16's rounding allows.
    """
    model = kt.load_model(FIXTURES_0_2 / "bare_pre_ln_bf16.keras")
    assert isinstance(model, kt.Transformer)
    assert model.encoder_blocks[0].dtype_policy.name == "mixed_bfloat16"
    assert model.norm_first and not model.share_embeddings
    x = {k: EXPECTED_0_2[f"bare/{k}"] for k in ("encoder_inputs", "decoder_inputs")}
    exact = keras.ops.convert_to_numpy(float32_twin(model)(x))
    np.testing.assert_allclose(exact, FLOAT32_0_2["bare_pre_ln_bf16"], atol=1e-5)
    np.testing.assert_allclose(exact, numpy_forward(model, x), atol=1e-4)

    logits = keras.ops.convert_to_numpy(model(x))
    assert logits.dtype == np.float32
    assert not np.array_equal(logits, exact)  # computed in bfloat16
    # Each rounding changes a value by at most BF16_U of itself; to first
    # order the logits' error is the sum of those the model's depth chains
    # together, relative to the logits' scale. That sum bounds each logit.
    # Rounding errors are as often up as down, so over all logits together
    # they add like a random walk: the norm of the error is about
    # sqrt(n) * BF16_U of the logits' norm (2.7 * BF16_U was measured
    # without bfloat16 instructions, 1.4 * BF16_U with them, for n = 64).
    n = bfloat16_roundings(model)
    error = logits - exact
    assert np.abs(error).max() <= n * BF16_U * np.abs(exact).max()
    assert np.linalg.norm(error) <= np.sqrt(n) * BF16_U * np.linalg.norm(exact)


def test_translator_of_0_2_0_translates_the_same():
    with keras_hub_missing():
        translator = kt.load_model(FIXTURES_0_2 / "translator.keras")
    assert type(translator.tokenizer) is SentencePieceTokenizer
    check_translator_of_0_2_0(translator)


def check_translator_of_0_2_0(translator):
    """What kt-train of 0.2.0 saved: same logits, translations and n-best."""
    assert isinstance(translator, kt.Translator)
    assert getattr(translator.transformer, "optimizer", None) is None
    x = {
        k: EXPECTED_0_2[f"translator/{k}"] for k in ("encoder_inputs", "decoder_inputs")
    }
    logits = keras.ops.convert_to_numpy(translator.transformer(x))
    np.testing.assert_allclose(logits, EXPECTED_0_2["translator/logits"], atol=1e-4)
    sentences = TEXT_0_2["sentences"]
    assert translator.translate(sentences, beam_size=1) == TEXT_0_2["greedy"]
    assert translator.translate(sentences) == TEXT_0_2["beam4"]
    n_best = translator.n_best(sentences, n=2, beam_size=2)
    for got, want in zip(n_best, TEXT_0_2["n_best"], strict=True):
        assert [text for text, _ in got] == [text for text, _ in want]
        np.testing.assert_allclose(
            [score for _, score in got], [score for _, score in want], atol=1e-4
        )


@pytest.mark.backends("tensorflow")  # keras-hub imports TensorFlow
def test_the_packages_tokenizer_wins_over_keras_hubs_registration():
    """Where keras-hub is installed and imported, its class holds the
    registered name the old files give; the package's still answers for it,
    and translates as 0.2.0 did."""
    import keras_hub

    name = "keras_hub>SentencePieceTokenizer"
    assert keras.saving.get_registered_object(name) is not None
    assert keras.saving.get_registered_object(name) is not SentencePieceTokenizer
    translator = kt.load_model(FIXTURES_0_2 / "translator.keras")
    assert type(translator.tokenizer) is SentencePieceTokenizer
    assert keras_hub.__name__ == "keras_hub"
    check_translator_of_0_2_0(translator)
