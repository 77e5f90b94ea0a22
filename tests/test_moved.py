"""0.3.0's module paths still import for one release: the module at its new
path, bound under the old name too, with a ``DeprecationWarning`` naming the
new path."""

import importlib
import subprocess
import sys

import pytest

from keras_transformer import _moved

pytestmark = pytest.mark.once


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_path_is_the_new_module_with_a_warning(old):
    new = _moved.MOVED[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    # A public name of the package that the old module path shares is still
    # the public object, not the module the import bound in its place.
    package, _, name = old.rpartition(".")
    public = importlib.import_module(package)
    if name in getattr(public, "__all__", ()):
        assert getattr(public, name) is getattr(module, name)


def test_every_new_path_exists_and_no_old_file_is_left():
    for old, new in _moved.MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        # An old file left beside the new one would shadow the alias.
        assert (
            importlib.machinery.PathFinder.find_spec(
                old.rpartition(".")[2],
                importlib.import_module(old.rpartition(".")[0]).__path__,
            )
            is None
        ), old


def test_old_from_imports_give_the_same_objects():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import keras_transformer as kt\n"
        "try:\n"
        "    from keras_transformer.translator import Translator\n"
        "except DeprecationWarning as w:\n"
        "    print('warned:', w)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from keras_transformer.translator import Translator\n"
        "from keras_transformer.decoding import beam_search\n"
        "print(Translator is kt.Translator, beam_search is kt.beam_search)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("warned: keras_transformer.translator moved to ")
    assert lines[-1] == "True True"
