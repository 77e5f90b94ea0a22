"""The command-line programs, installed by ``pip install`` as:

- ``kt-train``: train a translator (the built-in number task or a parallel
  corpus) and save ``translator.keras``;
- ``kt-evaluate``: BLEU and exact match of a saved translator on a test set;
- ``kt-curve``: validation BLEU of a run's checkpoints against training
  minutes, and the figure;
- ``kt-translate``: translate sentences (arguments or standard input);
- ``kt-attention``: draw a translator's attention maps;
- ``kt-benchmark``, ``kt-benchmark-decoding``: training and decoding speed;
- ``kt-step-speed``: the training step of ours against keras-hub's layers,
  timed in pairs in one process, and where each step's time goes;
- ``kt-keras-hub-recipe``: keras-hub's usual recipe on a corpus, for
  ``kt-curve``'s comparison.

Each module's ``main(argv)`` runs the command and returns its result;
``command()`` is the installed entry point. From a clone,
``python -m training.<name>`` runs the same command.

Importing this package (every command does) keeps freed memory in the
process, glibc's ``malloc`` permitting (``keras_transformer.allocator``;
``KT_KEEP_FREED_MEMORY=0`` leaves glibc's defaults).
"""

import contextlib
import importlib.util
import os
import sys

from keras_transformer.allocator import keep_freed_memory


def _verbose():
    return any(arg.startswith("--verbose") for arg in sys.argv[1:])


def _quiet_frameworks():
    """No TensorFlow, CUDA or absl start-up lines unless ``--verbose``.

    keras-hub's tokenizer imports TensorFlow, whose C++ start-up logs a
    oneDNN notice, a missing CUDA driver and a failed ``cuInit`` on a machine
    without a GPU: noise before the command's first line. TensorFlow's own
    lines obey ``TF_CPP_MIN_LOG_LEVEL``, which must be set before it loads,
    so it is set when a command's module is imported (``setdefault``: a level
    the user set wins); the absl lines do not (``start_tensorflow``).
    """
    if not _verbose():
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


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


def start_tensorflow():
    """Import TensorFlow and start its devices, silently unless ``--verbose``.

    XLA's and CUDA's start-up lines ("All log messages before
    absl::InitializeLog() ...", "Could not find cuda drivers", "failed call
    to cuInit") go through absl, which ignores ``TF_CPP_MIN_LOG_LEVEL``; the
    commands call this before their first use of the tokenizer, so that
    TensorFlow starts with stderr pointed away. A failure still raises its
    Python exception. Nothing happens without TensorFlow installed.
    """
    if _verbose() or importlib.util.find_spec("tensorflow") is None:
        return
    with _stderr_to_devnull():
        import tensorflow as tf

        tf.config.list_physical_devices()


_quiet_frameworks()
# Before the first step: freed big blocks stay for the next one (a fifth of a
# JAX step on the CPU was page faults; keras_transformer/allocator.py).
keep_freed_memory()
