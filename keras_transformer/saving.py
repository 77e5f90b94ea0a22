"""The package's classes registered with Keras, and ``.keras`` files loaded.

Keras finds a saved object's class (``keras_transformer>Translator``,
``keras_transformer>Transformer``, ...) only once the module that registers
it has run, and it imports no module of another package by itself (Keras
3.9 and later import the module a file names for Keras' own packages only).
So registration happens at the one moment a Keras user expects it, as with
keras-hub: when ``keras_transformer`` and Keras have both been imported, in
either order::

    import keras, keras_transformer
    keras.saving.load_model("runs/numbers/translator.keras")

``import keras_transformer`` itself imports neither Keras nor a backend (a
process that uses only the CTranslate2 engine never loads them). If Keras
is already imported, the package registers its classes there and then;
if not, ``watch()`` puts a finder on ``sys.meta_path`` that registers them
at the end of the first import that brings Keras in (the user's
``import keras``, or a module of this package that needs Keras), then takes
itself off. Registering imports the modules in ``REGISTERING`` (and what
they import), never Keras itself.
"""

import importlib
import importlib.abc
import sys
import threading
import warnings

# Every module that registers a class with Keras
# (``@keras.saving.register_keras_serializable``). Named, and imported only
# when ``register()`` runs: this module imports nothing of the package, so
# any module may call it. ``tests/test_keras_habits.py`` checks the list
# against the sources.
REGISTERING = (
    "keras_transformer.data.sentencepiece_layer",
    "keras_transformer.layers.attention",
    "keras_transformer.layers.blocks",
    "keras_transformer.layers.dropout",
    "keras_transformer.layers.embedding",
    "keras_transformer.layers.position",
    "keras_transformer.model.losses",
    "keras_transformer.model.schedules",
    "keras_transformer.model.transformer",
    "keras_transformer.pretrained.marian_tokenizer",
    "keras_transformer.translate.keras_translator",
)

# Module imports are thread-safe and idempotent, so two threads may both
# register at once; a lock of ours held across imports could deadlock with
# the import system's own module locks.
_registered = False


def register():
    """Register every class of this package with Keras, by importing the
    modules that define them (and with them Keras and its backend).

    Idempotent; after the first call, a flag's look-up.
    """
    global _registered
    if not _registered:
        # Off first: the imports below are plain ones, never counted.
        _Watcher.stop()
        for module in REGISTERING:
            importlib.import_module(module)
        _registered = True


def watch():
    """Register now if Keras is imported, else once it is (see the module's
    docstring). Called by ``keras_transformer/__init__.py``."""
    if "keras" in sys.modules:
        register()
    else:
        _Watcher.start()


class _Watcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it hands the imports of ``keras`` and of this
    package's modules to the finders after it, and wraps their loaders in
    ``_Counted``, which registers at the end of the outermost one once
    Keras is in ``sys.modules``.

    The outermost, not the first to finish: Keras is often first imported
    by one of this package's modules, half run at that moment, and the
    registering modules import each other's names.
    """

    _installed = None
    imports = threading.local()  # .depth: the counted imports running here

    @classmethod
    def start(cls):
        if cls._installed is None:
            cls._installed = cls()
            sys.meta_path.insert(0, cls._installed)

    @classmethod
    def stop(cls):
        watcher, cls._installed = cls._installed, None
        if watcher is not None and watcher in sys.meta_path:
            sys.meta_path.remove(watcher)

    def find_spec(self, fullname, path, target=None):
        if fullname != "keras" and not fullname.startswith("keras_transformer."):
            return None
        finders = list(sys.meta_path)
        if self not in finders:  # another thread has just registered
            return None
        for finder in finders[finders.index(self) + 1 :]:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec else None
            if spec is not None:
                break
        else:
            return None
        if hasattr(spec.loader, "exec_module"):
            spec.loader = _Counted(spec.loader)
        return spec


class _Counted:
    """A module's own loader, its ``exec_module`` counted (everything else
    is the wrapped loader's: resources, source, code)."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        imports = _Watcher.imports
        depth = getattr(imports, "depth", 0)
        imports.depth = depth + 1
        try:
            self._loader.exec_module(module)
        finally:
            imports.depth = depth
        if depth == 0 and "keras" in sys.modules and not _registered:
            _register_after_import()


def _register_after_import():
    # The user's ``import keras`` must not fail for this package's sake: a
    # module that cannot be imported here is named in a warning, and
    # ``load_model`` raises its error.
    try:
        register()
    except Exception as error:  # noqa: BLE001 (re-raised by load_model)
        warnings.warn(
            f"keras_transformer could not register its classes with Keras "
            f"({type(error).__name__}: {error}); keras.saving.load_model will "
            f"not find them, and keras_transformer.load_model says why.",
            RuntimeWarning,
            stacklevel=2,
        )


def load_model(filepath, **kwargs):
    """``keras.saving.load_model(filepath, **kwargs)`` with this package's
    classes registered first: a translator, a ``Transformer`` or any model
    holding this package's layers, losses or schedules.

    Args:
        filepath: str or path-like, a ``.keras`` file (or what Keras' own
            ``load_model`` takes).
        **kwargs: passed to ``keras.saving.load_model`` (``custom_objects``,
            ``compile``, ``safe_mode``).

    Returns:
        The saved object (a ``Translator`` for a ``translator.keras``).
    """
    import keras

    register()
    return keras.saving.load_model(filepath, **kwargs)
