"""Files saved by keras_transformer 0.3.0 load, with the same logits and
translations, on every backend.

``tests/fixtures/v0_3_0/`` holds what 0.3.0 wrote on JAX
(``make_fixtures.py``): the trained numbers translator of 0.2.0 loaded and
saved again by 0.3.0, and a bare ``build_model`` model (float32, post-LN,
separate embeddings), with the logits and translations 0.3.0 gave. Their
configs name 0.3.0's module paths (``keras_transformer.translator``,
``keras_transformer.model``), which moved in 0.4.0; Keras finds the classes
by their registered names, so loading them imports no old path (a
``DeprecationWarning`` would fail these tests: pytest turns warnings into
errors).

The logits are compared in float32 only, with a tolerance for a CPU other
than the one that wrote them (other vector instructions, other sums).
"""

import json
import pathlib
import zipfile

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.model.transformer import Transformer
from keras_transformer.translate.keras_translator import Translator
from tests.test_compat import keras_hub_missing, numpy_forward

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "v0_3_0"
EXPECTED = np.load(FIXTURES / "expected.npz")
TEXT = json.loads((FIXTURES / "expected.json").read_text())
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
INPUTS = ("encoder_inputs", "decoder_inputs")


def load(path):
    """The file loaded as if keras-hub were not installed (its translator
    names keras-hub's tokenizer class)."""
    with keras_hub_missing():
        return kt.load_model(path)


def saved_config(path):
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("config.json"))


def logits_of(model, x):
    # Called, not predict(): no compiled predict step (on PyTorch, a slow
    # torch.compile where a file holds jit_compile=True).
    return keras.ops.convert_to_numpy(model(x))


@pytest.mark.once  # reads the archives' JSON: no backend involved
def test_the_fixtures_are_files_of_0_3_0():
    """What the tests below load is 0.3.0's format: its module paths."""
    assert TEXT["keras_transformer"] == "0.3.0"
    bare = saved_config(FIXTURES / "bare_post_ln_separate.keras")
    assert bare["module"] == "keras_transformer.model"
    translator = saved_config(FIXTURES / "translator.keras")
    assert translator["module"] == "keras_transformer.translator"
    assert translator["config"]["transformer"]["module"] == "keras_transformer.model"
    assert translator["config"]["search_dtype"] == "float32"  # new in 0.3.0


def test_bare_model_of_0_3_0_gives_the_same_logits():
    model = load(FIXTURES / "bare_post_ln_separate.keras")
    assert type(model) is Transformer and isinstance(model, kt.Transformer)
    assert model.encoder_blocks[0].dtype_policy.name == "float32"
    assert not model.norm_first and not model.share_embeddings
    assert (model.src_vocab_size, model.tgt_vocab_size) == (30, 25)
    assert model.layer_norm_epsilon == 1e-5 and model.attention_dropout == 0.1
    assert len(model.encoder_blocks) == len(model.decoder_blocks) == 2
    assert model.encoder_norm is None and model.decoder_norm is None
    x = {k: EXPECTED[f"bare/{k}"] for k in INPUTS}
    logits = logits_of(model, x)
    assert logits.dtype == np.float32
    np.testing.assert_allclose(
        logits, EXPECTED["bare_post_ln_separate/logits"], **TOLERANCE
    )
    np.testing.assert_allclose(logits, numpy_forward(model, x), atol=1e-4)


def test_translator_of_0_3_0_translates_the_same():
    translator = load(FIXTURES / "translator.keras")
    assert type(translator) is Translator and isinstance(translator, kt.Translator)
    assert type(translator.transformer) is Transformer
    assert translator.search_dtype == "float32"
    assert translator.max_output_length is None
    assert getattr(translator.transformer, "optimizer", None) is None
    x = {k: EXPECTED[f"translator/{k}"] for k in INPUTS}
    logits = logits_of(translator.transformer, x)
    np.testing.assert_allclose(logits, EXPECTED["translator/logits"], **TOLERANCE)
    sentences = TEXT["sentences"]
    assert translator.translate(sentences, beam_size=1) == TEXT["greedy"]
    assert translator.translate(sentences, beam_size=4) == TEXT["beam4"]
    n_best = translator.n_best(sentences, n=2, beam_size=2)
    for got, want in zip(n_best, TEXT["n_best"], strict=True):
        assert [text for text, _ in got] == [text for text, _ in want]
        np.testing.assert_allclose(
            [score for _, score in got], [score for _, score in want], atol=1e-4
        )


@pytest.mark.parametrize(
    "name, key, module",
    [
        (
            "bare_post_ln_separate",
            "bare",
            "keras_transformer.model.transformer",
        ),
        (
            "translator",
            "translator",
            "keras_transformer.translate.keras_translator",
        ),
    ],
)
def test_file_of_0_3_0_saved_again_loads_the_same(tmp_path, name, key, module):
    """Saved by 0.4.0, the file names 0.4.0's module paths and loads again
    with the same logits (and, for the translator, the same translations)."""
    model = load(FIXTURES / f"{name}.keras")
    model.save(tmp_path / "again.keras")
    config = saved_config(tmp_path / "again.keras")
    assert config["module"] == module
    if name == "translator":
        transformer = config["config"]["transformer"]
        assert transformer["module"] == "keras_transformer.model.transformer"
    again = load(tmp_path / "again.keras")
    assert type(again) is type(model)
    x = {k: EXPECTED[f"{key}/{k}"] for k in INPUTS}
    if name == "translator":
        assert again.translate(TEXT["sentences"], beam_size=1) == TEXT["greedy"]
        model, again = model.transformer, again.transformer
    want = logits_of(model, x)
    np.testing.assert_array_equal(logits_of(again, x), want)
    np.testing.assert_allclose(want, EXPECTED[f"{name}/logits"], **TOLERANCE)
