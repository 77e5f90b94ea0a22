"""``import keras_transformer`` imports nothing more: the modules that need
neither Keras nor a backend (the CTranslate2 engine, the tokenizer contract
and SentencePiece, the search settings) and the public names they define
load without Keras, in a fresh process with ``KERAS_BACKEND`` unset;
``kt.load_model`` loads a ``.keras`` file with no other name used before.
(Keras' own ``load_model`` after ``import keras_transformer``:
``tests/test_keras_habits.py``.)
"""

import json
import os
import pathlib
import subprocess
import sys

import keras
import pytest

import keras_transformer as kt
from tests.installed_commands import HEAVY

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.once

# The public names of modules that import neither Keras nor a backend.
KERAS_FREE = (
    "CONFIGS",
    "SearchOptions",
    "TransformerConfig",
    "TranslatorBase",
    "length_penalty",
    "load_model",
    "transformer_config",
)
# Without Keras, each module is imported, then the package's Keras-free
# names are resolved; after each step, the heavy packages loaded so far.
# Then the backend is chosen and a .keras file loaded with kt.load_model.
SCRIPT = f"""
import importlib, json, os, sys

HEAVY = {HEAVY!r}
MODULES = (
    "keras_transformer",
    "keras_transformer.translate.ctranslate2_translator",
    "keras_transformer.data.contract",
    "keras_transformer.data.sentencepiece",
    "keras_transformer.search.options",
)


def heavy():
    return sorted({{name.split(".")[0] for name in sys.modules}} & set(HEAVY))


loaded = {{}}
for module in MODULES:
    importlib.import_module(module)
    loaded[module] = heavy()
import keras_transformer as kt

names = {KERAS_FREE!r}
for name in [*names, "__version__"]:
    getattr(kt, name)
loaded["names"] = heavy()
os.environ["KERAS_BACKEND"] = sys.argv[2]
model = kt.load_model(sys.argv[1])
print(json.dumps({{"loaded": loaded, "names": names, "model": type(model).__name__}}))
"""


def test_without_keras_until_a_model_is_loaded(tmp_path):
    path = str(tmp_path / "tiny.keras")
    kt.build_model(
        "tiny", src_vocab_size=20, num_layers=1, d_model=8, num_heads=2, d_ff=16
    ).save(path)
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, path, keras.backend.backend()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["loaded"] == dict.fromkeys(out["loaded"], []), out["loaded"]
    assert out["names"] == list(KERAS_FREE)
    assert out["model"] == "Transformer"
