"""A Keras user's habits, tested the way a user meets them: a new process,
``import keras_transformer`` (before or after ``import keras``, or one of
its subpackages instead), then ``keras.saving.load_model(path)`` without
``custom_objects``, on every backend: a bare ``build_model`` model, a
translator, and the files 0.1.0, 0.2.0 and 0.3.0 saved. (An imported Marian
translator: ``tests/test_marian.py``.)

The package registers its classes when it and Keras are both imported
(``keras_transformer.saving``); these tests hold that promise, and that
without the package's import Keras cannot load the files at all.
"""

import json
import os
import pathlib
import subprocess
import sys
import warnings

import keras
import pytest

import keras_transformer as kt
from keras_transformer import saving

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

# The ways a program brings the package and Keras in. With Keras first, the
# process tries the first file before the package's import too: that load
# must fail (Keras finds no class of another package by itself).
IMPORTS = {
    "keras first": (
        "import keras\n"
        "try:\n"
        "    keras.saving.load_model(sys.argv[2])\n"
        "except TypeError as error:\n"
        "    before = str(error)\n"
        "import keras_transformer"
    ),
    "package first": "import keras_transformer\nimport keras",
    "a subpackage's class": (
        "from keras_transformer.model.transformer import Transformer\nimport keras"
    ),
}
OLD_FILES = sorted(FIXTURES.glob("v0_*/*.keras"))

# Loads each file given, then prints what it loaded: the class, the number
# of weights, the greedy translations of the sentences given by the
# translators saved by 0.3.0 and today (those of 0.1.0 and 0.2.0:
# tests/test_compat.py), and whether TensorFlow was imported.
LOADER = """
import json, sys

before = None
{imports}
sentences = json.loads(sys.argv[1])
loaded = []
for path in sys.argv[2:]:
    thing = keras.saving.load_model(path)
    translations = None
    if hasattr(thing, "translate") and "v0_1_0" not in path and "v0_2_0" not in path:
        translations = thing.translate(sentences, beam_size=1)
    loaded.append([type(thing).__name__, thing.count_params(), translations])
tensorflow = "tensorflow" in sys.modules
print(json.dumps({{"loaded": loaded, "tensorflow": tensorflow, "before": before}}))
"""


def load_in_new_process(paths, imports, sentences=(), backend=None):
    """What ``LOADER`` printed, run in a new Python with ``imports``; the
    process's stderr if it failed."""
    env = dict(os.environ, KERAS_BACKEND=backend or keras.backend.backend())
    env["PYTHONPATH"] = str(ROOT)
    code = LOADER.format(imports=imports)
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(list(sentences)), *map(str, paths)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        return done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def files_of_today(tmp_path_factory):
    """A bare model saved from ``build_model`` and a translator saved by
    this version (0.3.0's numbers translator, loaded and saved again)."""
    folder = tmp_path_factory.mktemp("habits")
    bare = folder / "bare.keras"
    kt.build_model(
        "tiny", src_vocab_size=30, num_layers=1, d_model=16, num_heads=2, d_ff=32
    ).save(bare)
    translator = folder / "translator.keras"
    with warnings.catch_warnings():
        # Keras 3.15.1's variables lack __array__'s copy keyword (pyproject).
        warnings.simplefilter("ignore", DeprecationWarning)
        kt.load_model(FIXTURES / "v0_3_0" / "translator.keras").save(translator)
    return bare, translator


# 0.3.0's translator, and today's saved from it: their first sentences and
# the greedy translations 0.3.0 recorded.
RECORDED = json.loads((FIXTURES / "v0_3_0" / "expected.json").read_text())
SENTENCES = RECORDED["sentences"][:3]


def expected(path):
    """What the file must give: its class and weight count as this process
    loads it, and for 0.3.0's translator and today's 0.3.0's translations."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        thing = kt.load_model(path)
    translated = isinstance(thing, kt.Translator) and "v0_1_0" not in str(path)
    translated = translated and "v0_2_0" not in str(path)
    greedy = RECORDED["greedy"][:3] if translated else None
    return [type(thing).__name__, thing.count_params(), greedy]


@pytest.mark.parametrize("how", sorted(IMPORTS))
def test_keras_load_model_finds_the_classes_after_the_package_is_imported(
    how, files_of_today
):
    # Every file in the first form; today's files and 0.3.0's translator in
    # the others (the import, not the file, is what they vary).
    if how == "keras first":
        paths = [*files_of_today, *OLD_FILES]
    else:
        paths = [*files_of_today, FIXTURES / "v0_3_0" / "translator.keras"]
    got = load_in_new_process(paths, IMPORTS[how], SENTENCES)
    assert isinstance(got, dict), got[-3000:]
    assert [tuple(g) for g in got["loaded"]] == [tuple(expected(p)) for p in paths]
    if how == "keras first":
        assert "Could not locate class 'Transformer'" in got["before"]
    # Old translators name keras-hub's tokenizer, and keras-hub imports
    # TensorFlow: they load without it.
    assert got["tensorflow"] == (keras.backend.backend() == "tensorflow")


@pytest.mark.once
def test_a_module_that_cannot_register_leaves_import_keras_working(tmp_path):
    """A registering module that fails to import (a broken install) costs a
    warning at ``import keras``, not the user's import; ``kt.load_model``
    raises the error itself."""
    code = (
        "import sys, warnings\n"
        "sys.modules['keras_transformer.pretrained.marian_vocabularies'] = None\n"
        "import keras_transformer as kt\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import keras\n"
        "print([str(w.message) for w in caught if w.category is RuntimeWarning])\n"
        "try:\n"
        "    kt.load_model('missing.keras')\n"
        "except ImportError as error:\n"
        "    print('ImportError', error.name)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    warned, raised = done.stdout.strip().splitlines()[-2:]
    assert "could not register its classes with Keras" in warned
    assert "marian_vocabularies" in warned
    assert raised == "ImportError keras_transformer.pretrained.marian_vocabularies"


def _registers(path):
    """Whether the module at ``path`` registers a class or function with
    Keras (``@keras.saving.register_keras_serializable(...)``)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        for decorator in getattr(node, "decorator_list", ()):
            call = decorator.func if isinstance(decorator, ast.Call) else decorator
            name = getattr(call, "attr", getattr(call, "id", None))
            if name == "register_keras_serializable":
                return True
    return False


@pytest.mark.once
def test_register_imports_every_module_that_registers_a_class():
    registering = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "keras_transformer").rglob("*.py")
        if _registers(path)
    }
    assert registering == set(saving.REGISTERING)
    saving.register()
    assert registering <= set(sys.modules)


@pytest.mark.once
def test_once_registered_the_package_leaves_the_import_system_as_it_was():
    # This process imported Keras first (conftest.py), then the package.
    assert not any(type(f).__module__ == saving.__name__ for f in sys.meta_path)
