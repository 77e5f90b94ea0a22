"""Other libraries' private names are touched in one module of the package,
``_guards/private_api.py`` (the fence), which checks each one and takes the
public path, with one warning, where it cannot.

The scan reads the package's source, and ``docs/commands_reference.py``
(whose argparse reads go through the fence). A private name (``_name``, not a
dunder) is another library's when:

- it is imported from another library's private module (``keras.src``) or
  by its private name (``from argparse import _HelpAction``);
- it is read, set or deleted on another library's module (``threading.
  _DummyThread``), or by name with ``getattr``/``setattr``/``hasattr``;
- it is read, set or deleted on any other object (``variable._value``,
  ``lazy._available = False``) and either the package never defines it or
  one of the fenced libraries' sources (Keras, argparse, threading,
  tensorboardX) uses it;
- in a class that derives from another library's class (``keras.Model``),
  it is defined, set or read on ``self`` or ``super()`` and that class has
  it (an override of ``_make_function``, ``self._tracker = ...``; a Keras
  model or layer has what its trainer and layer bases have on any
  backend), or the package never defines it.

"Defines": a ``def``, a ``class``, a variable, an argument, an import's
alias, an attribute set on ``self`` that no base class of another library
has, or an attribute set on anything else under a name none of the fenced
libraries uses. A few underscored names are public API (``os._exit``, named tuples'
``_replace``...).

Outside the fence, the one touch allowed is an override of a method that
the fence lists in ``TRAINER_HOOKS`` (with ``super()``'s method of the same
name inside it): a class has to define it, and the fence checks that Keras
still has it.
"""

import _thread
import ast
import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import pathlib
import re
import subprocess
import sys
import threading
import types
import warnings

import keras
import pytest

from keras_transformer._guards import private_api

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "keras_transformer"
FENCE = "keras_transformer/_guards/private_api.py"
BACKEND = keras.backend.backend()

# Underscored, and public all the same: documented API of their library.
PUBLIC_UNDERSCORED = {
    "_exit",  # os._exit
    "_asdict",  # named tuples
    "_replace",
    "_fields",
    "_field_defaults",
    "_make",
}
FENCED_LIBRARIES = ("keras", "argparse", "threading", "tensorboardX")
# Every private name the fence touches now. A new one is added here on
# purpose, with its check and its public path in the fence.
FENCED = {
    "_purge_model_variables",
    "_make_function",
    "_should_torch_compile",
    "_jax_state",
    "_jax_state_synced",
    "_value",
    "_distribute_strategy",
    "keras.src.utils",
    "_available",
    "_actions",
    "_action_groups",
    "_mutually_exclusive_groups",
    "_group_actions",
    "_format_action_invocation",
    "_expand_help",
    "_DummyThread",
}
STRING_FORMS = {"getattr", "setattr", "hasattr", "delattr"}
SELF = ("self", "cls")
_PRIVATE_IN_SOURCE = re.compile(r"(?:\.|\bdef |\bclass |^\s*)(_[A-Za-z]\w*)", re.M)


def _private(name):
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _library_sources(name):
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return []
    origin = pathlib.Path(spec.origin)
    if origin.name == "__init__.py":
        return [
            p for p in origin.parent.rglob("*.py") if not p.name.endswith("_test.py")
        ]
    return [origin]


@functools.cache
def foreign_names():
    """The private names that the fenced libraries' sources use."""
    names = set()
    for library in FENCED_LIBRARIES:
        for path in _library_sources(library):
            text = path.read_text(encoding="utf-8", errors="replace")
            names.update(_PRIVATE_IN_SOURCE.findall(text))
    return names


def _class_names(cls):
    """What another library's class has: its attributes and what its
    methods (and its bases') set on ``self``. A Keras model or layer has
    what its trainer and layer base classes have on every backend: Keras
    picks the running backend's at import, and the scan must find the same
    on each."""
    names = set(dir(cls))
    sources = []
    for klass in cls.__mro__:
        if klass is object:
            continue
        with contextlib.suppress(OSError, TypeError):
            sources.append(inspect.getsource(klass))
    backends = pathlib.Path(importlib.util.find_spec("keras.src.backend").origin).parent
    for base, file in ((keras.Model, "trainer.py"), (keras.layers.Layer, "layer.py")):
        if issubclass(cls, base):
            sources += [p.read_text() for p in sorted(backends.glob(f"*/{file}"))]
    for text in sources:
        for attribute, method in re.findall(r"self\.(_\w+)|\bdef (_\w+)", text):
            names.add(attribute or method)
    return names


def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


class Module:
    """One source file: its tree, its imports, its classes."""

    def __init__(self, path, text):
        self.path = path
        self.tree = ast.parse(text)
        self.bound = {}  # local name -> the dotted path it was imported as
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.bound[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.bound[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.bound[alias.asname or alias.name] = (
                        f"{node.module}.{alias.name}"
                    )
        self.classes = {
            node.name: node
            for node in ast.walk(self.tree)
            if isinstance(node, ast.ClassDef)
        }

    def resolve(self, dotted):
        head, _, rest = dotted.partition(".")
        if head not in self.bound:
            return None
        return self.bound[head] + (f".{rest}" if rest else "")


@functools.cache
def _module(path, text):
    return Module(path, text)


class Package:
    """The modules of ``sources`` ({path: text}) and what they define."""

    def __init__(self, sources):
        self.modules = {path: _module(path, text) for path, text in sources.items()}
        self.by_dotted = {
            path.removesuffix(".py").removesuffix("/__init__").replace("/", "."): module
            for path, module in self.modules.items()
        }
        self.foreign = foreign_names()
        self._bases = {}
        self.own = self._own_names()

    # -- the classes' bases ---------------------------------------------------

    def foreign_attributes(self, module, classdef):
        """What the other libraries' classes that ``classdef`` derives from
        have (empty when it derives from none)."""
        key = (module.path, classdef.name)
        if key not in self._bases:
            self._bases[key] = set()  # a cycle ends here
            names = set()
            for base in classdef.bases:
                names |= self._base_names(module, _dotted(base))
            self._bases[key] = names
        return self._bases[key]

    def _base_names(self, module, dotted):
        if dotted is None or dotted == "object":
            return set()
        if dotted in module.classes:
            return self.foreign_attributes(module, module.classes[dotted])
        target = module.resolve(dotted)
        if target is None:
            return set()
        if target.split(".")[0] == PACKAGE:
            owner, _, name = target.rpartition(".")
            defining = self.by_dotted.get(owner)
            if defining is not None and name in defining.classes:
                return self.foreign_attributes(defining, defining.classes[name])
            return set()
        return self._library_class_names(target)

    @staticmethod
    @functools.cache
    def _library_class_names(target):
        parts = target.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                value = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for part in parts[cut:]:
                    value = getattr(value, part)
            except AttributeError:
                return set()
            return _class_names(value) if isinstance(value, type) else set()
        return set()

    # -- what the package defines -------------------------------------------------

    def _own_names(self):
        own = set()
        for module in self.modules.values():
            for node, classdef, function in _walk_with_scopes(module.tree):
                inherited = (
                    self.foreign_attributes(module, classdef) if classdef else set()
                )
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if function is not None or node.name not in inherited:
                        own.add(node.name)
                elif isinstance(node, ast.ClassDef):
                    own.add(node.name)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    own.add(node.id)
                elif isinstance(node, ast.arg):
                    own.add(node.arg)
                elif isinstance(node, ast.alias):
                    own.add(node.asname or node.name.split(".")[0])
                for target, name in _set_attributes(node):
                    on_self = isinstance(target, ast.Name) and target.id in SELF
                    if on_self and classdef is not None:
                        if name not in inherited:
                            own.add(name)
                    elif name not in self.foreign:
                        own.add(name)
        return own

    # -- the touches --------------------------------------------------------------

    def touches(self):
        """``(path, line, name, allowed)`` for every private name of another
        library that the package touches."""
        hooks = {name for names in private_api.TRAINER_HOOKS.values() for name in names}
        found = []
        for path, module in self.modules.items():
            in_fence = path == FENCE
            for node, classdef, function in _walk_with_scopes(module.tree):
                for name, why in self._touched(module, node, classdef, function):
                    allowed = in_fence or (why == "override" and name in hooks)
                    found.append((path, node.lineno, name, allowed))
        return found

    def _touched(self, module, node, classdef, function):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from self._imported(node)
            return
        inherited = self.foreign_attributes(module, classdef) if classdef else set()
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and classdef is not None
            and function is None  # a method, not a function inside one
            and _private(node.name)
            and node.name in inherited
        ):
            yield node.name, "override"
        for target, name in _touched_attributes(node):
            if not _private(name) or name in PUBLIC_UNDERSCORED:
                continue
            dotted = _dotted(target)
            bound = module.resolve(dotted) if dotted else None
            if bound is not None:
                if bound.split(".")[0] != PACKAGE:
                    yield name, "module"
                # else the package's own module: tests/test_layout.py
                continue
            is_super = (
                isinstance(target, ast.Call)
                and isinstance(target.func, ast.Name)
                and target.func.id == "super"
            )
            on_self = isinstance(target, ast.Name) and target.id in SELF
            if classdef is not None and (is_super or on_self):
                if name in inherited:
                    same = function is not None and function.name == name and is_super
                    yield name, "override" if same else "inherited"
                elif name not in self.own:
                    yield name, "undefined"
            elif name in self.foreign or name not in self.own:
                yield name, "object"

    @staticmethod
    def _imported(node):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != PACKAGE and _private_path(alias.name):
                    yield alias.name, "import"
        elif node.module and not node.level and node.module.split(".")[0] != PACKAGE:
            if _private_path(node.module):
                yield node.module, "import"
            for alias in node.names:
                if _private(alias.name):
                    yield alias.name, "import"


def _private_path(dotted):
    parts = dotted.split(".")
    return parts[:2] == ["keras", "src"] or any(_private(part) for part in parts[1:])


def _string_name(call):
    if len(call.args) >= 2 and isinstance(call.args[1], ast.Constant):
        value = call.args[1].value
        if isinstance(value, str):
            return value
    return None


def _string_form(node):
    """``(object, name)`` of ``getattr(object, "_name")`` and the like
    (``object.__setattr__(self, "_name", value)`` too), else None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    plain = isinstance(func, ast.Name) and func.id in STRING_FORMS
    dunder = isinstance(func, ast.Attribute) and func.attr in (
        "__setattr__",
        "__getattribute__",
        "__delattr__",
    )
    name = _string_name(node)
    if (plain or dunder) and name is not None:
        return node.args[0], name
    return None


def _setter(node):
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "setattr") or (
        isinstance(func, ast.Attribute) and func.attr == "__setattr__"
    )


def _set_attributes(node):
    """``(object, name)`` of each attribute that ``node`` sets."""
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        yield node.value, node.attr
    elif isinstance(node, ast.Call) and _setter(node):
        form = _string_form(node)
        if form is not None:
            yield form


def _touched_attributes(node):
    """``(object, name)`` of each attribute that ``node`` reads, sets or
    deletes."""
    if isinstance(node, ast.Attribute):
        yield node.value, node.attr
    form = _string_form(node)
    if form is not None:
        yield form


def _walk_with_scopes(tree):
    """Every node with the class whose methods it is in (None outside any)
    and its innermost function."""

    def visit(node, classdef, function):
        yield node, classdef, function
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.ClassDef):
                yield from visit(child, node, None)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, classdef, node)
            else:
                yield from visit(child, classdef, function)

    yield from visit(tree, None, None)


# Scanned with the package: the docs tool that reads argparse's lists.
TOOLS = ("docs/commands_reference.py",)


def package_sources():
    paths = [*sorted((ROOT / PACKAGE).rglob("*.py")), *(ROOT / t for t in TOOLS)]
    return {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in paths
    }


def outside_the_fence(extra=None):
    """``path:line name`` of each touch of another library's private name
    outside the fence, in the package with ``extra`` ({path: text}) added."""
    sources = {**package_sources(), **(extra or {})}
    touches = Package(sources).touches()
    return sorted(f"{p}:{line} {name}" for p, line, name, ok in touches if not ok)


@pytest.fixture(scope="module")
def scanned():
    return Package(package_sources())


# -- the scan ------------------------------------------------------------------


@pytest.mark.once
def test_private_names_of_other_libraries_are_touched_in_the_fence_only(scanned):
    outside = sorted(
        f"{p}:{n} {name}" for p, n, name, ok in scanned.touches() if not ok
    )
    assert not outside, (
        "private names of other libraries touched outside "
        f"{FENCE}: move each into it, checked, with a public path: {outside}"
    )


@pytest.mark.once
def test_the_private_names_touched_are_the_ones_listed(scanned):
    """The inventory: what the package touches, in the fence and by the
    overrides it lists, is FENCED, no more and no less (a new private name
    is added there on purpose)."""
    assert {name for _, _, name, _ in scanned.touches()} == FENCED


@pytest.mark.once
def test_each_trainer_hook_is_overridden_or_used(scanned):
    touched = {name for _, _, name, _ in scanned.touches()}
    hooks = {name for names in private_api.TRAINER_HOOKS.values() for name in names}
    assert hooks <= touched


@pytest.mark.once
@pytest.mark.parametrize(
    "source, name",
    [
        ("def f(model):\n    return model._jit_compile\n", "_jit_compile"),
        ("def f(model):\n    model._jax_state_synced = True\n", "_jax_state_synced"),
        ("def f(v):\n    return getattr(v, '_value', None)\n", "_value"),
        ("from keras.src.utils import module_utils\n", "keras.src.utils"),
        ("import threading\nT = threading._shutdown\n", "_shutdown"),
        ("from argparse import _HelpAction\n", "_HelpAction"),
        (
            "import keras\n\nclass M(keras.Model):\n"
            "    def _maybe_build(self, shapes):\n"
            "        return super()._maybe_build(shapes)\n",
            "_maybe_build",
        ),
        (
            "import keras\n\nclass L(keras.layers.Layer):\n"
            "    def call(self, x):\n        self._tracker = None\n        return x\n",
            "_tracker",
        ),
    ],
    ids=[
        "read",
        "set",
        "getattr",
        "keras.src",
        "stdlib",
        "imported",
        "override",
        "keras-state",
    ],
)
def test_a_new_private_touch_outside_the_fence_fails(source, name):
    added = "keras_transformer/search/added.py"
    outside = outside_the_fence({added: source})
    assert [entry for entry in outside if entry.startswith(added)]
    assert any(entry.endswith(f" {name}") for entry in outside), outside
    # The same lines in the fence are its business.
    assert not outside_the_fence({FENCE: private_api_source() + "\n" + source})


def private_api_source():
    return (ROOT / FENCE).read_text(encoding="utf-8")


@pytest.mark.once
def test_the_package_own_private_names_are_not_touches():
    source = (
        "import keras\n\nclass L(keras.layers.Layer):\n"
        "    def _own_helper(self):\n        self._own_state = 1\n"
        "        return self._own_state\n\n"
        "def f(model):\n    model._own_cache = {}\n    return model._own_cache\n"
    )
    assert not outside_the_fence({"keras_transformer/search/added.py": source})


# -- the fence's checks and public paths ------------------------------------------


@pytest.fixture
def fresh(monkeypatch):
    """The fence with nothing said yet."""
    monkeypatch.setattr(private_api, "_said", set())
    return private_api


def runtime_warnings(caught):
    return [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_the_trainer_hooks_are_there_on_this_keras(fresh):
    for name in fresh.TRAINER_HOOKS.get(BACKEND, ()):
        assert hasattr(keras.Model, name), name
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.fault_guards()


def test_an_untested_keras_is_said_once_and_the_guards_stand_aside(fresh, monkeypatch):
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Two threads' first calls may ask at once.
        threads = [threading.Thread(target=fresh.fault_guards) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert fresh.fault_guards() is False
    (warning,) = runtime_warnings(caught)
    assert "tested with Keras 3.15; Keras 3.99.0 is installed" in str(warning.message)
    assert "fault guards stand aside" in str(warning.message)


@pytest.mark.skipif(BACKEND != "jax", reason="the JAX trainer's state")
def test_a_jax_model_without_the_trainer_state_is_not_guarded(fresh):
    model = types.SimpleNamespace(variables=[types.SimpleNamespace()])
    with pytest.warns(RuntimeWarning, match=r"has no Model\._jax_state_synced, Var"):
        assert fresh.fault_guards(model) is False


def test_a_torch_step_decision_without_the_hook_is_false(fresh):
    assert fresh.should_torch_compile(types.SimpleNamespace()) is False
    decided = types.SimpleNamespace(_should_torch_compile=lambda: True)
    assert fresh.should_torch_compile(decided) is True


def test_the_tf_strategy_note_and_its_public_path(fresh):
    assert fresh.no_tf_distribution(types.SimpleNamespace(_distribute_strategy=None))
    assert not fresh.no_tf_distribution(types.SimpleNamespace(_distribute_strategy=1))
    with pytest.warns(RuntimeWarning, match=r"has no Model\._distribute_strategy"):
        assert fresh.no_tf_distribution(types.SimpleNamespace()) is False


def test_an_untested_keras_leaves_the_optimizer_to_keras(fresh, monkeypatch):
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    model = types.SimpleNamespace(_distribute_strategy=None)
    with pytest.warns(RuntimeWarning, match="inside the first traced step"):
        assert fresh.no_tf_distribution(model) is False


@pytest.mark.once
@pytest.mark.parametrize("kept_out", [True, False], ids=["in-the-block", "without"])
def test_keras_on_jax_seeds_without_importing_tensorflow(kept_out):
    """Against the real Keras: ``set_random_seed`` imports TensorFlow
    (where it is installed) unless the block keeps it out."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed: nothing to keep out")
    code = (
        "import contextlib, sys, keras\n"
        "from keras_transformer._guards import private_api\n"
        f"block = private_api.keras_without_tensorflow() if {kept_out} "
        "else contextlib.nullcontext()\n"
        "with block:\n"
        "    keras.utils.set_random_seed(0)\n"
        "print('tensorflow' in sys.modules)\n"
    )
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(not kept_out)]


@pytest.fixture
def lazy_tensorflow(monkeypatch):
    """Keras' note of TensorFlow, for a module no one has imported."""
    from keras.src.utils import module_utils

    lazy = module_utils.LazyModule("kt_module_that_is_not_installed")
    monkeypatch.setattr(module_utils, "tensorflow", lazy)
    return module_utils


@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow runs Keras")
def test_keras_is_kept_from_tensorflow_for_the_block(fresh, lazy_tensorflow):
    lazy = lazy_tensorflow.tensorflow
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fresh.keras_without_tensorflow():
            assert lazy.available is False
    assert lazy._available is None


@pytest.mark.skipif(BACKEND != "tensorflow", reason="another backend runs Keras")
def test_on_tensorflow_keras_note_is_left_alone(fresh, lazy_tensorflow):
    with fresh.keras_without_tensorflow():
        assert lazy_tensorflow.tensorflow._available is None


@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow runs Keras")
def test_an_untested_keras_keeps_its_note_of_tensorflow(
    fresh, lazy_tensorflow, monkeypatch
):
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    with pytest.warns(RuntimeWarning, match="Keras imports TensorFlow where"):
        with fresh.keras_without_tensorflow():
            assert lazy_tensorflow.tensorflow._available is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fresh.keras_without_tensorflow():  # said once
            pass


@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow runs Keras")
def test_a_keras_without_the_note_is_left_alone(fresh, lazy_tensorflow, monkeypatch):
    renamed = types.SimpleNamespace(name="kt_module_that_is_not_installed", module=None)
    monkeypatch.setattr(lazy_tensorflow, "tensorflow", renamed)
    match = r"has no keras\.src\.utils\.module_utils\.tensorflow\._available"
    with pytest.warns(RuntimeWarning, match=match):
        with fresh.keras_without_tensorflow():
            assert not hasattr(renamed, "_available")


def _on_a_thread_python_did_not_start(function):
    done, result = threading.Event(), []

    def run():
        try:
            result.append(function())
        finally:
            done.set()

    _thread.start_new_thread(run, ())
    assert done.wait(60)
    return result[0]


def test_a_thread_python_did_not_start_is_told_apart(fresh):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh.started_outside_python() is False
        assert _on_a_thread_python_did_not_start(fresh.started_outside_python)


def test_on_an_untested_python_threads_are_taken_as_python_s(fresh, monkeypatch):
    monkeypatch.setattr(fresh, "TESTED_PYTHON", ("2.7",))
    with pytest.warns(RuntimeWarning, match=r"tested with Python 2\.7; Python 3"):
        assert _on_a_thread_python_did_not_start(fresh.started_outside_python) is False


def test_without_the_dummy_thread_class_threads_are_taken_as_python_s(
    fresh, monkeypatch
):
    monkeypatch.delattr(threading, "_DummyThread")
    with pytest.warns(RuntimeWarning, match=r"has no threading\._DummyThread"):
        assert fresh.started_outside_python() is False


@pytest.mark.once
def test_importing_the_fence_imports_nothing_heavy():
    """A command that runs no Keras (a CTranslate2 export) imports it."""
    code = (
        "import sys\nimport keras_transformer._guards.private_api\n"
        "heavy = {'keras', 'tensorflow', 'jax', 'torch', 'numpy'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
