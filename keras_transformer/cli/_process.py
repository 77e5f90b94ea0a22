"""What a command sets for its whole process, first thing in its ``main``.

Nothing here runs on import: a program that imports the library keeps its
logging and its C library's allocator as they were.
"""

import contextlib
import importlib.util
import os
import sys
import warnings

from keras_transformer.trainer.allocator import keep_freed_memory
from keras_transformer.data.corpus import CorpusWarning


def prepare_process(verbose=False):
    """A command's process-wide settings, made before any framework starts.

    Without ``verbose``, TensorFlow's C++ start-up lines (a oneDNN notice, a
    missing CUDA driver on a machine without a GPU) are hidden: they obey
    ``TF_CPP_MIN_LOG_LEVEL`` only if it is set before TensorFlow loads, which
    on JAX and PyTorch happens later, with the tokenizer (a level the user
    set wins). Freed memory is kept in the process (``allocator``): a
    training step on the CPU then stops page-faulting its big arrays in again.
    Warnings about the user's files print as one line.
    """
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    keep_freed_memory()
    if not getattr(warnings.formatwarning, "one_line", False):
        warnings.formatwarning = _one_line(warnings.formatwarning)


def _one_line(default):
    """Warnings about the user's files as one line each, like the errors."""

    def format_warning(message, category, filename, lineno, line=None):
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
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def start_tensorflow(verbose=False):
    """Import TensorFlow and start its devices, silently unless ``verbose``.

    XLA's and CUDA's start-up lines go through absl, which ignores
    ``TF_CPP_MIN_LOG_LEVEL``; the commands call this before their first use
    of the tokenizer, so that TensorFlow starts with stderr pointed away. A
    failure still raises its Python exception. Nothing happens without
    TensorFlow installed.
    """
    if verbose or importlib.util.find_spec("tensorflow") is None:
        return
    with _stderr_to_devnull():
        import tensorflow as tf

        tf.config.list_physical_devices()
