"""0.3.0's module paths still import for one release: a module at each old
path binds it to the module at the new path, with a ``DeprecationWarning``
naming the new path. ``keras_transformer.attention_maps`` is gone as a
module path: it names the public function."""

import importlib
import pathlib
import subprocess
import sys

import pytest

import keras_transformer as kt
from keras_transformer import _moved

pytestmark = pytest.mark.once

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Old dotted path -> new dotted path.
MOVED = {
    "keras_transformer.allocator": "keras_transformer.trainer.allocator",
    "keras_transformer.callbacks": "keras_transformer.trainer.callbacks",
    "keras_transformer.checkpoints": "keras_transformer.trainer.checkpoints",
    "keras_transformer.cluster": "keras_transformer.distribute.cluster",
    "keras_transformer.configs": "keras_transformer.model.config",
    "keras_transformer.decoding": "keras_transformer.search.decoding",
    "keras_transformer.evaluation": "keras_transformer.translate.evaluation",
    "keras_transformer.export.ctranslate2_translator": (
        "keras_transformer.translate.ctranslate2_translator"
    ),
    "keras_transformer.losses": "keras_transformer.model.losses",
    "keras_transformer.plotting": "keras_transformer.translate.plotting",
    "keras_transformer.schedules": "keras_transformer.model.schedules",
    "keras_transformer.search_options": "keras_transformer.search.options",
    "keras_transformer.translator": "keras_transformer.translate.keras_translator",
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_with_a_warning(old):
    new = MOVED[old]
    sys.modules.pop(old, None)
    namespace = {}
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}") as warned:
        exec(compile(f"import {old} as module", "old_program.py", "exec"), namespace)
    assert namespace["module"] is importlib.import_module(new) is sys.modules[old]
    # The warning names the line that imports the old path.
    assert [w.filename for w in warned] == ["old_program.py"]


def test_every_module_at_an_old_path_is_listed():
    found = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "keras_transformer").rglob("*.py")
        if "_moved.alias(" in path.read_text()
    }
    assert found == set(MOVED)


def test_attention_maps_is_the_function_not_an_old_path():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("keras_transformer.attention_maps")
    assert kt.attention_maps.__module__ == "keras_transformer.translate.attention_maps"
    assert callable(kt.attention_maps)


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


def shims_left(version):
    """The 0.3.0 paths and names still in the package if it were at
    ``version``, from 0.5 on (they go in 0.5.0); none before."""
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) < (0, 5):
        return []
    modules = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "keras_transformer").rglob("*.py")
        if "_moved.alias(" in path.read_text()
    ]
    names = [f"kt.{name}" for name in kt._DEPRECATED]
    config = ROOT / "keras_transformer" / "model" / "config.py"
    if "def get_config(" in config.read_text():
        names.append("kt.get_config")
    return sorted(modules) + names


def test_the_0_3_0_paths_and_names_are_gone_in_0_5():
    assert _moved.REMOVED_IN == "0.5.0"
    assert shims_left(kt.__version__) == []


def test_from_0_5_on_each_path_and_name_left_is_named():
    """The check above can fail: at 0.5.0 it names what is still here."""
    left = shims_left("0.5.0")
    modules = left[: len(MOVED)]
    assert {".".join(pathlib.Path(p).with_suffix("").parts) for p in modules} == set(
        MOVED
    )
    assert left[len(MOVED) :] == ["kt.keep_freed_memory", "kt.get_config"]
