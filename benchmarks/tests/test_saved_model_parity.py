"""benchmarks/saved_model_parity.py run end to end on the trained number
translator of 0.2.0 (tests/fixtures/v0_2_0), whose beam-4 translations are
known (expected.json, which test_compat.py checks on every backend): the
export and the translator agree on them, and the times it reports are the
ones a scripted clock gave, so that each figure is worked out by hand. And
the float32 reference it compares with, built from a bfloat16 model."""

import json
import os
import pathlib
import types
import warnings

import keras
import numpy as np
import pytest

from benchmarks import saved_model_parity as parity
from benchmarks import timing

FIXTURES = pathlib.Path(__file__).parents[2] / "tests" / "fixtures" / "v0_2_0"
KNOWN = json.loads((FIXTURES / "expected.json").read_text())


@pytest.mark.once
def test_median_is_the_middle_or_the_upper_middle():
    assert parity.median([3.0, 1.0, 2.0]) == 2.0
    assert parity.median([4.0, 1.0]) == 4.0
    assert parity.median([5.0]) == 5.0


@pytest.mark.once
def test_float32_reference_copies_a_bfloat16_model_in_float32():
    from keras_transformer import build_model
    from keras_transformer.data import tokenizer as tk
    from keras_transformer.data.numbers import english
    from keras_transformer.translate.keras_translator import Translator

    words = [english(n) for n in range(0, 100, 3)]
    tokenizer = tk.make_tokenizer(tk.train_tokenizer(words, 40))
    model = build_model(
        "tiny",
        src_vocab_size=tokenizer.vocabulary_size(),
        num_layers=1,
        d_model=8,
        num_heads=2,
        d_ff=16,
        dtype="mixed_bfloat16",
    )
    translator = Translator(
        tokenizer, model, max_output_length=7, search={"beam_size": 2}
    )
    reference = parity.float32_reference(translator)
    assert reference.tokenizer is translator.tokenizer
    assert reference.max_output_length == 7
    assert reference.default_search == translator.default_search
    copy = reference.transformer
    assert copy is not model
    assert copy.target_embedding.dtype_policy.name == "float32"
    assert model.target_embedding.dtype_policy.name == "mixed_bfloat16"
    assert {**copy.get_config(), "dtype": None} == {**model.get_config(), "dtype": None}
    for a, b in zip(copy.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def _scripted_clock(monkeypatch, times):
    """``perf_counter`` for the benchmark and its timer, reading ``times``."""
    readings = iter(times)
    clock = types.SimpleNamespace(perf_counter=lambda: next(readings))
    monkeypatch.setattr(parity, "time", clock)
    monkeypatch.setattr(timing, "time", clock)


@pytest.mark.once("tensorflow")  # the benchmark's backend: it exports in process
def test_a_run_on_the_number_translator(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tensorflow_text")
    # (start, end) of: the export, the load, the first call of each, then
    # three rounds of warm calls in turns (SavedModel, then Translator).
    _scripted_clock(
        monkeypatch,
        [0.0, 3.0, 10.0, 10.5, 20.0, 22.0, 30.0, 34.0]
        + [40.0, 40.3, 50.0, 50.6, 60.0, 60.1, 70.0, 70.9, 80.0, 80.2, 90.0, 90.4],
    )
    outputs = []
    real_time_both = parity.time_both

    def time_both(exported, translated, repeats):
        result = real_time_both(exported, translated, repeats)
        outputs.append(result[:2])
        return result

    monkeypatch.setattr(parity, "time_both", time_both)
    n = 3
    source = tmp_path / "source.txt"
    source.write_text("".join(f"{s}\n" for s in KNOWN["sentences"]))
    output, path = tmp_path / "saved_model", tmp_path / "parity.json"
    with warnings.catch_warnings():
        # TensorFlow's tracing, on some versions, warns about its own code.
        warnings.simplefilter("ignore", DeprecationWarning)
        result = parity.main(
            ["--model", str(FIXTURES / "translator.keras"), "--source", str(source),
             "--limit", str(n), "--repeats", "3", "--no-jit-compile",
             "--output", str(output), "--json", str(path)]
        )  # fmt: skip

    ((got, want),) = outputs
    assert got == want == KNOWN["beam4"][:n]
    assert json.loads(path.read_text()) == result
    size = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(output)
        for name in names
    )
    assert size > 0
    expected = {
        "model": str(FIXTURES / "translator.keras"),
        "source": str(source),
        "sentences": n,
        "identical": n,
        "differ": [],
        "beam_size": 4,
        "length_penalty": 0.6,
        "batch_size": 64,
        "jit_compile": False,
        "source_dtype_policy": "float32",
        "export_seconds": 3.0,
        "saved_model_bytes": size,
        "load_seconds": 0.5,
        "first_call_seconds": {"saved_model": 2.0, "translator": 4.0},
        "warm_seconds": {"saved_model": 0.2, "translator": 0.6},
        "warm_all_seconds": {
            "saved_model": [0.3, 0.1, 0.2],
            "translator": [0.6, 0.9, 0.4],
        },
        "backend": keras.backend.backend(),
    }
    assert {k: result[k] for k in expected} == expected
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [
        "3 of 3 translations identical (beam 4, α 0.6, jit_compile=False, "
        "model trained as float32)",
        "export 3.0 s, load 0.5 s; first call: SavedModel 2.0 s, Translator "
        "4.0 s; warm: SavedModel 0.2 s, Translator 0.6 s",
    ]
