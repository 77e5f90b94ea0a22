"""What a command sets for its whole process, first thing in its ``main``.

Nothing here runs on import, and nothing heavy is imported here: a command
given a CTranslate2 export must not load Keras, a backend or TensorFlow. A
program that imports the library keeps its logging and its C library's
allocator as they were.
"""

import contextlib
import importlib.util
import json
import os
import sys
import warnings

from keras_transformer._guards import private_api
from keras_transformer.cli._extras import require

# TensorFlow's and XLA's C++ log level (JAX's XLA reads it too) without
# --verbose: fatal errors only.
QUIET_LOG_LEVEL = "3"


def prepare_process(verbose=False, keras=True):
    """A command's process-wide settings, made before any framework starts.

    Without ``verbose``, TensorFlow's and XLA's C++ lines (a oneDNN notice, a
    missing CUDA driver on a machine without a GPU, the XLA devices) are
    hidden: ``TF_CPP_MIN_LOG_LEVEL`` is set to 3 whatever it was, since a
    level the user set for other programs would let some through (at 2, a
    failed ``cuInit`` at the first compiled search; at 0, JAX's devices).
    ``verbose`` leaves it as the user has it. Warnings about the user's
    files print as one line.

    With ``keras`` (the command will run Keras), freed memory is kept in
    the process (``trainer.allocator``): a training step on the CPU then
    stops page-faulting its big arrays in again. A command that runs no
    Keras (``keras=False``: a CTranslate2 export) imports nothing more and
    leaves the allocator as it is.
    """
    if not verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = QUIET_LOG_LEVEL
    if not getattr(warnings.formatwarning, "one_line", False):
        warnings.formatwarning = _one_line(warnings.formatwarning)
    if keras:
        # Keras and its backend start first, quietly (TensorFlow's start-up
        # lines ignore the log level): the threads they start take arenas of
        # their own before the setting allows one more, so that none of
        # them splits the main arena's freed blocks.
        with _quiet_native_stderr(verbose):
            import keras  # noqa: F401

            from keras_transformer.trainer.allocator import keep_freed_memory
        keep_freed_memory()


def start_engine(engine, verbose=False):
    """Import what ``engine`` translates with (``_arguments.model_engine``),
    before the model loads: a missing package raises
    ``_extras.MissingPackage`` at once, and TensorFlow, where it is the
    Keras backend, starts with its lines hidden.
    """
    if engine == "keras":
        start_tensorflow(verbose)
        with _quiet_native_stderr(verbose):
            require("keras")
    else:
        require(engine)


def _one_line(default):
    """Warnings about the user's files as one line each, like the errors."""

    def format_warning(message, category, filename, lineno, line=None):
        from keras_transformer.data.corpus import CorpusWarning

        if issubclass(category, CorpusWarning):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    format_warning.one_line = True
    return format_warning


@contextlib.contextmanager
def _stderr_to_devnull():
    """File descriptor 2 to /dev/null: C++ code writes there, not to
    ``sys.stderr``."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _quiet_native_stderr(verbose):
    """``_stderr_to_devnull`` unless ``verbose``."""
    return contextlib.nullcontext() if verbose else _stderr_to_devnull()


def start_tensorflow(verbose=False):
    """Import TensorFlow and start its devices, silently unless ``verbose``.

    Its start-up lines before absl's logging is set up (the CUDA stubs, the
    CPU instructions, "All log messages before absl::InitializeLog()") go to
    stderr whatever ``TF_CPP_MIN_LOG_LEVEL`` says; the commands call this
    before Keras starts, so that TensorFlow starts with stderr pointed away.
    A failure still raises its Python exception. Nothing happens without
    TensorFlow installed, or where another backend runs Keras: no JAX or
    PyTorch process imports TensorFlow.
    """
    if verbose or keras_backend() != "tensorflow":
        return
    if importlib.util.find_spec("tensorflow") is None:
        return
    with _stderr_to_devnull():
        import tensorflow as tf

        tf.config.list_physical_devices()


def keras_backend():
    """The backend Keras will start, read as Keras reads it (without
    importing Keras): ``KERAS_BACKEND``, else ``keras.json`` in
    ``KERAS_HOME`` (default ``~/.keras``), else TensorFlow."""
    backend = os.environ.get("KERAS_BACKEND")
    if backend:
        return backend
    home = os.environ.get("KERAS_HOME") or os.path.join(
        os.path.expanduser("~"), ".keras"
    )
    try:
        with open(os.path.join(home, "keras.json"), encoding="utf-8") as file:
            return json.load(file).get("backend", "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def keras_without_tensorflow():
    """Keras, in the block, as if TensorFlow were not installed, where
    another backend runs it and nothing has imported TensorFlow.

    Keras imports TensorFlow wherever it is installed: to seed it too
    (``keras.utils.set_random_seed``, for ``tf.data``) and to look for its
    types in a model it saves. A JAX or PyTorch run uses neither, and the
    import costs seconds, memory and TensorFlow's start-up lines on stderr.
    Keras' note of whether TensorFlow imports is private: it is set through
    ``private_api``, for the block only, and on a Keras it was not tested
    with, or one without the note, Keras imports TensorFlow as before (with
    one warning).
    """
    return private_api.keras_without_tensorflow()
