"""``import keras_transformer`` imports nothing more: the modules that need
neither Keras nor a backend (the CTranslate2 engine, the tokenizer contract
and SentencePiece, the search settings) and the public names they define
load without Keras, in a fresh process with ``KERAS_BACKEND`` unset;
``kt.load_model`` loads a ``.keras`` file with no other name used before;
a name that needs Keras registers the package's classes with Keras first
(``saving.register``), one that needs none does not.
"""

import ast
import json
import os
import pathlib
import subprocess
import sys

import keras
import pytest

import keras_transformer as kt
from keras_transformer import saving
from tests.installed_commands import HEAVY

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.once

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

names = [name for name, module in kt._PUBLIC.items() if module in kt._WITHOUT_KERAS]
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
    assert {"SearchOptions", "length_penalty", "TranslatorBase", "load_model"} <= set(
        out["names"]
    )
    assert out["model"] == "Transformer"


def test_only_names_that_need_keras_register_the_classes(monkeypatch):
    calls = []
    monkeypatch.setattr(saving, "register", lambda: calls.append("register"))
    for name in ("SearchOptions", "length_penalty", "TranslatorBase", "__version__"):
        getattr(kt, name)
    assert calls == []
    assert kt.build_model is kt.model.transformer.build_model
    assert calls == ["register"]


def _registers(path):
    """Whether the module at ``path`` registers a class or function with
    Keras (``@keras.saving.register_keras_serializable(...)``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        for decorator in getattr(node, "decorator_list", ()):
            call = decorator.func if isinstance(decorator, ast.Call) else decorator
            name = getattr(call, "attr", getattr(call, "id", None))
            if name == "register_keras_serializable":
                return True
    return False


def test_register_imports_every_module_that_registers_a_class():
    registering = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "keras_transformer").rglob("*.py")
        if _registers(path)
    }
    assert registering == set(saving.REGISTERING)
    saving.register()
    assert registering <= set(sys.modules)
