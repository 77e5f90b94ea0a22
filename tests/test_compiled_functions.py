"""The searches compiled for a model are kept on it (one per key, shared by
every call), and are none of its state: not weights, not layers, not in
its saved file, and gone with the model."""

import gc
import weakref

import keras
import numpy as np

from keras_transformer import build_model
from keras_transformer.search import decoding

VOCAB = 40


def tiny_model():
    keras.utils.set_random_seed(0)
    return build_model(
        "tiny", src_vocab_size=VOCAB, num_layers=1, d_model=16, num_heads=2,
        d_ff=32, max_length=16,
    )  # fmt: skip


def sources():
    src = np.full((2, 5), 7, "int32")
    src[:, -1] = decoding.END_ID
    return src


def test_one_function_per_key_and_no_state(tmp_path):
    model = tiny_model()
    model(
        {"encoder_inputs": sources(), "decoder_inputs": sources()}
    )  # built, as a loaded model is
    weights, layers = len(model.weights), len(model.layers)
    config = model.get_config()

    def fn(*args):
        return args

    first = decoding.compiled_function(model, ("probe",), fn)
    assert decoding.compiled_function(model, ("probe",), fn) is first
    assert decoding.compiled_function(model, ("other",), fn) is not first
    tokens, _ = decoding.greedy_search(model, sources(), 4, 4)

    assert (len(model.weights), len(model.layers)) == (weights, layers)
    assert model.get_config() == config
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert len(loaded.weights) == weights
    np.testing.assert_array_equal(
        decoding.greedy_search(loaded, sources(), 4, 4)[0], tokens
    )


def test_the_functions_go_with_the_model():
    model = tiny_model()
    decoding.greedy_search(model, sources(), 4, 4)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
