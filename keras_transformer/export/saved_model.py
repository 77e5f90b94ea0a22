"""A ``Translator`` as a TensorFlow SavedModel: strings in, strings out.

``export_saved_model(translator, "exported/1")`` (or
``translator.export_saved_model("exported/1")``) writes a SavedModel whose signature
``translate`` (also ``serving_default``) maps ``texts``, a ``tf.string``
tensor of shape ``[None]``, to ``{"translations": tf.string [None]}``.
Writing it needs TensorFlow and ``tensorflow-text`` on every backend (the
extra ``saved-model``); loading it needs them and nothing else: no Keras,
no ``keras_transformer``::

    import tensorflow as tf
    import tensorflow_text  # registers the SentencePiece ops

    translate = tf.saved_model.load("exported/1").signatures["translate"]
    translate(texts=tf.constant(["one hundred one"]))["translations"]

For TensorFlow Serving, export to a numbered folder (``models/de_en/1``).
Its model server links tensorflow-text's ops in (the SentencePiece ones
used here are old ones); it runs XLA on the CPU only with
``--xla_cpu_compilation_enabled=true``, and some GPU builds have no XLA
compiler (tensorflow/serving#2214), which matters for ``jit_compile=True``
exports (the default). This module's tests load the export with
``tf.saved_model.load``; a model server was not tried.

What the graph does is what ``Translator.translate`` does, with what the
translator and its tokenizer's contract (``keras_transformer.data.contract``)
give, never constants of its own:

- tokenize with the tokenizer's SentencePiece model (its
  ``export_files()``; a ``tensorflow_text.SentencepieceTokenizer`` kept in
  the SavedModel as a resource), append the end id (``special_ids()``), and
  cut a source longer than ``source_max_length`` to its first
  ``source_max_length - 1`` ids and the end id (the translator warns about
  it; the graph cannot). Only a tokenizer of kind ``"sentencepiece"``, whose
  ids are its model's piece ids, can be written so: any other (a Marian
  checkpoint's, whose ids are ``vocab.json``'s) is refused with a
  ``ValueError`` before anything is written;
- sort the sources by length and search in chunks of ``batch_size``
  sentences, each padded to a power-of-two number of rows (at most
  ``batch_size``) and to the translator's bucket widths (8, 16, 32, ... up
  to ``source_max_length``), with the translator's output limit per
  sentence (source length + ``extra_output_length``, §6.1's 50, or
  ``max_output_length``, never more than ``target_max_length``);
- search with ``keras_transformer.search.decoding`` (cached beam search, greedy
  when ``beam_size=1``, stopping once the best hypothesis is settled as
  ``Translator.translate`` does) in float32, XLA-compiled as the
  translator's loop is on TensorFlow (``jit_compile=False``: plain
  TensorFlow ops). The output width is a Python int of the search, so the
  graph holds one search per output bucket that a chunk can need (with no
  fixed ``max_output_length``, every bucket from that of
  ``extra_output_length`` up; one with it) and picks one per chunk
  (``tf.switch_case``); rows and source width are left dynamic, and XLA
  compiles each new shape on first use, once per process (as for the
  translator);
- detokenize by ``decode``'s rule (each best hypothesis cut at the end id,
  padding and start ids dropped) and put the sentences back in input
  order.

The search's settings are fixed when exporting (default: 4 beams, α = 0.6)
and recorded with the model, with the package version, the transformer's
config and the source model's dtype policy: in ``assets/translation.json``
and from ``tf.saved_model.load(path).metadata()`` (a dict of constants).

A translator trained under ``mixed_bfloat16`` is exported as a float32 copy
of its transformer (same weights): the SavedModel computes in float32.

On JAX and PyTorch the backend's ops are not TensorFlow ops: the translator
is saved to a temporary ``.keras`` file, and a subprocess with
``KERAS_BACKEND=tensorflow`` loads and exports it (``python -m
keras_transformer.export._saved_model_child JOB.json``); its errors come
back as the same exception types.

The export is written to a temporary sibling of ``path`` and renamed into
place: no half-written SavedModel is ever left at ``path``.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid

# The signature's names, for callers: translate(texts=...)["translations"].
from keras_transformer.export.saved_model_graph import (
    INPUT,
    OUTPUT,
    SIGNATURE,
    check_translator,
    require_tensorflow_text,
    write_graph,
)

__all__ = ["INPUT", "OUTPUT", "SIGNATURE", "check_translator", "export_saved_model"]

# Errors a subprocess export raises again as themselves in the caller.
_RERAISED = {
    error.__name__: error
    for error in (
        ValueError,
        TypeError,
        ImportError,
        ModuleNotFoundError,
        FileNotFoundError,
        FileExistsError,
        PermissionError,
        OSError,
        MemoryError,
    )
}


def export_saved_model(
    translator, path, search=None, overwrite=False, jit_compile=True, **options
):
    """Write ``translator`` as a TensorFlow SavedModel with a ``translate``
    signature (see the module's docstring).

    Args:
        translator: a ``keras_transformer.Translator``.
        path: the SavedModel's directory (created; its parent too).
        search: optional ``SearchOptions``: ``beam_size``,
            ``length_penalty``, ``max_output_length``, ``batch_size``
            (sentences per search), ``use_cache``, fixed in the export;
            ``verbose`` has no effect.
        overwrite: replace what is at ``path``; otherwise a ``path`` that
            exists and is not an empty directory is refused.
        jit_compile: compile the searches with XLA, as the translator
            does on TensorFlow (on a CPU, Multi30k's ``small`` model
            translated its validation set about 20 % faster so, after a
            first call that compiles). False: plain TensorFlow ops, for
            servers without XLA (TensorFlow Serving runs XLA on the CPU
            only with ``--xla_cpu_compilation_enabled=true``).
        **options: ``SearchOptions`` fields, replacing ``search``'s.

    Returns:
        str: the absolute path of the SavedModel.

    Raises:
        TypeError, ValueError: bad search options, or a tokenizer whose
            ids are not one SentencePiece model's (before anything is
            written).
        FileExistsError: ``path`` exists, is not empty and ``overwrite`` is
            False; nothing is changed.
        ImportError: ``tensorflow`` or ``tensorflow-text`` is not installed
            (the message names the extra ``saved-model``).
        RuntimeError: the export subprocess (JAX, PyTorch) failed otherwise.
    """
    from keras_transformer.search.options import (
        SearchOptions,
        refuse_transformers_form,
    )

    check_translator(translator)
    search = translator.search_options(search, **options)
    refuse_transformers_form(search, "the SavedModel export")
    # A truthy string such as "no" must not replace a directory.
    for name, value in (("overwrite", overwrite), ("jit_compile", jit_compile)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool. Received: {name}={value!r}")
    # The batch size is fixed in the graph: the translator's default unless given.
    search = SearchOptions.of(
        search, batch_size=search.batch_size_or(translator.default_batch_size)
    )
    path = os.path.abspath(os.fspath(path))
    _check_target(path, overwrite)

    import keras

    in_process = keras.backend.backend() == "tensorflow"
    require_tensorflow_text(load=in_process)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    temp = _sibling(path)
    try:
        if in_process:
            write_graph(translator, temp, search, jit_compile=jit_compile)
        else:
            _write_in_subprocess(translator, temp, search, jit_compile)
        _replace(temp, path)
    finally:
        if os.path.lexists(temp):
            shutil.rmtree(temp, ignore_errors=True)
    return path


# -- checks --------------------------------------------------------------------


def _check_target(path, overwrite):
    if overwrite or not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
        return
    raise FileExistsError(
        f"{path} exists and is not empty; choose another path or pass "
        "overwrite=True to replace it."
    )


# -- files: a temporary sibling, renamed into place -------------------------------


def _sibling(path):
    """A new temporary name next to ``path``, in ``atomic``'s pattern."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{uuid.uuid4().hex[:8]}.tmp")


def _replace(temp, path):
    """Move the finished export ``temp`` to ``path``; what was at ``path``
    is moved aside first and deleted once the new one is in place."""
    from keras_transformer.atomic import fsync_dir

    old = None
    if os.path.lexists(path):
        old = _sibling(path)
        os.replace(path, old)
    try:
        os.replace(temp, path)
    except BaseException:
        if old is not None:
            os.replace(old, path)
        raise
    fsync_dir(os.path.dirname(path))
    if old is not None:
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.unlink(old)


# -- the export in a TensorFlow subprocess (JAX, PyTorch) -------------------------


def _write_in_subprocess(translator, directory, search, jit_compile):
    import keras

    import keras_transformer

    # Next to the export (its file system has room for the model), not in
    # /tmp; removed however the export ends.
    head, name = os.path.split(directory)
    with tempfile.TemporaryDirectory(prefix=f"{name}.", dir=head) as scratch:
        model_path = os.path.join(scratch, "translator.keras")
        result_path = os.path.join(scratch, "result.json")
        translator.save(model_path)
        environment = dict(os.environ, KERAS_BACKEND="tensorflow")
        # Tracing and saving need no accelerator: the parent's (JAX holds
        # most of a GPU's memory) are left alone.
        environment["CUDA_VISIBLE_DEVICES"] = ""
        environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # This keras_transformer, wherever the parent found it.
        package_root = os.path.dirname(os.path.dirname(keras_transformer.__file__))
        paths = [package_root, *filter(None, [environment.get("PYTHONPATH")])]
        environment["PYTHONPATH"] = os.pathsep.join(paths)
        job = {
            "model": model_path,
            "output": directory,
            "search": dataclasses.asdict(search),
            "jit_compile": bool(jit_compile),
            "result": result_path,
        }
        job_path = os.path.join(scratch, "job.json")
        with open(job_path, "w", encoding="utf-8") as file:
            json.dump(job, file)
        command = [
            sys.executable,
            "-m",
            "keras_transformer.export._saved_model_child",
            job_path,
        ]
        process = subprocess.run(
            command, env=environment, capture_output=True, text=True, check=False
        )
        result = None
        if os.path.exists(result_path):
            with open(result_path, encoding="utf-8") as file:
                result = json.load(file)
    if process.returncode == 0 and result is not None and result.get("ok"):
        return result["metadata"]
    backend = keras.backend.backend()
    if result is not None and not result.get("ok"):
        error = _RERAISED.get(result["type"])
        message = (
            f"exporting the SavedModel (in a TensorFlow subprocess, from the "
            f"{backend} backend) failed: {result['type']}: {result['message']}"
        )
        if error is None:  # unexpected: where it happened helps
            raise RuntimeError(f"{message}\n{result.get('traceback', '')}")
        raise error(message)
    tail = (process.stderr or process.stdout or "").strip()[-3000:]
    raise RuntimeError(
        f"exporting the SavedModel (in a TensorFlow subprocess, from the "
        f"{backend} backend) failed with exit status {process.returncode}:\n{tail}"
    )
